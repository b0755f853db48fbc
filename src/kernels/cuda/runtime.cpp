// The process's CUDA context and the raw device-memory boundary of parm/device.h.
#include "kernels/cuda/runtime.h"

#include <cstdlib>
#include <mutex>

#include "parm/device.h"
#include "parm/error.h"

namespace parm {
namespace cuda {

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) [[likely]]
    return;
  (void)cudaGetLastError();  // clear a sticky launch error so the message is not repeated
  detail::throw_check_failure(file, line, call,
                              fmt::format("CUDA error {}: {}", cudaGetErrorName(status),
                                          cudaGetErrorString(status)));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  detail::throw_check_failure(file, line, call,
                              fmt::format("cuBLAS error {}: {}", cublasGetStatusName(status),
                                          cublasGetStatusString(status)));
}

namespace {

// Rank of this process among the processes of its node, from the launcher's environment
// (not a collective: the context may be created at different points on different ranks);
// 0 outside a launcher.
int local_rank() {
  // LOCAL_RANK: torchrun's and torch.multiprocessing's (parm.launch.spawn), for
  // parm.init(backend="torch", device="cuda").
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                          "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return 0;
}

}  // namespace

Context& context() {
  static Context ctx;
  static std::once_flag once;
  std::call_once(once, [] {
    const int n = cuda_device_count();
    PARM_CONFIG_CHECK(n > 0,
                      "--device cuda: no CUDA GPU is visible to this process (cudaGetDeviceCount "
                      "found none); use --device cpu");
    ctx.device = local_rank() % n;
    PARM_CUDA_CHECK(cudaSetDevice(ctx.device));
    PARM_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    PARM_CUBLAS_CHECK(cublasCreate(&ctx.cublas));
    PARM_CUBLAS_CHECK(cublasSetStream(ctx.cublas, ctx.stream));
    PARM_CUDA_CHECK(
        cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, ctx.device));
  });
  return ctx;
}

}  // namespace cuda

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void* device_alloc(size_t bytes) {
  cuda::Context& c = cuda::context();
  void* p = nullptr;
  if (bytes == 0) bytes = 1;
  PARM_CUDA_CHECK(cudaMalloc(&p, bytes));
  PARM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c.stream));
  PARM_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return p;
}

void device_free(void* p) {
  if (p != nullptr) (void)cudaFree(p);  // never throws: called from destructors
}

void device_zero(void* p, size_t bytes) {
  if (bytes > 0) PARM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda::stream()));
}

void device_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  cudaStream_t s = cuda::stream();
  PARM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  PARM_CUDA_CHECK(cudaStreamSynchronize(s));
}

void device_sync() { PARM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream())); }

}  // namespace parm
