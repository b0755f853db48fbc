// main() of the multi-rank test binary: every rank runs every test; rank 0 prints gtest's
// report, other ranks print only their failures; the exit code is non-zero on every rank
// when any rank failed. `--world-size N` is required and checked: a wrong world size fails.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mpi_test_util.h"
#include "parm/device.h"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_, r.file_name(), r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int expected = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--world-size") == 0) expected = std::atoi(argv[i + 1]);
  if (expected != size) {
    if (rank == 0)
      std::fprintf(stderr, "parm_mpi_tests: expected --world-size %d but running on %d ranks\n",
                   expected, size);
    MPI_Finalize();
    return 1;
  }
#ifdef PARM_TESTS_NEED_GPU
  // The GPU test binary on a machine without a GPU: skipped (ctest's SKIP_RETURN_CODE), not
  // passed.
  if (parm::cuda_device_count() == 0) {
    if (rank == 0) std::printf("parm_gpu_tests: no CUDA GPU visible: skipped\n");
    MPI_Finalize();
    return 77;
  }
#endif
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("parm_mpi_tests on %d ranks: %s\n", size, failed ? "FAILED" : "all passed");
  MPI_Finalize();
  return failed;
}
