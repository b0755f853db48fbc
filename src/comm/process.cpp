#include "comm/process.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdlib>

#include "comm/mpi_check.h"
#include "parm/timer.h"

namespace parm::process {
namespace {

bool running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

}  // namespace

void init(int* argc, char*** argv) {
  PARM_MPI_CHECK(MPI_Init(argc, argv));
  PARM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

void finalize() {
  if (running()) MPI_Finalize();
}

void abort_job(int code) {
  if (running()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; without MPI there is no job to end
}

int world_rank() {
  int r = 0;
  if (running()) PARM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int world_size() {
  int n = 1;
  if (running()) PARM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  return n;
}

bool barrier_within(double timeout_s) {
  if (!running()) return true;
  MPI_Request req;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return false;
  const double deadline_us = now_us() + timeout_s * 1e6;
  int done = 0;
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
         now_us() < deadline_us)
    usleep(1000);
  return done != 0;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  PARM_MPI_CHECK(MPI_Get_library_version(text, &len));
  const std::string line(text, static_cast<size_t>(len));
  return line.substr(0, line.find_first_of(",\n"));
}

}  // namespace parm::process
