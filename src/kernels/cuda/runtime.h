// The CUDA runtime of a process (CUDA builds only; include from src/**/cuda/ files): the GPU
// the process is bound to, its compute stream, and the check macros every CUDA, cuBLAS and
// NCCL call goes through.
//
// One compute stream per process: every kernel, cuBLAS call and device copy of the layer is
// queued on it, so they run in program order without explicit events; the NCCL
// communicator's collectives are queued on it too (and the fused collectives on two extra
// streams of their own, joined back to it with events).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace parm::cuda {

// Throws parm::Error "<file>:<line>: <call> failed: <library message>" on a failure.
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

#define PARM_CUDA_CHECK(call) ::parm::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define PARM_CUBLAS_CHECK(call) ::parm::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: the launch's own error (bad configuration), not the kernel's.
#define PARM_CUDA_CHECK_LAUNCH() PARM_CUDA_CHECK(cudaGetLastError())

struct Context {
  int device = 0;                  // the GPU of this process
  cudaStream_t stream = nullptr;   // the compute stream
  cublasHandle_t cublas = nullptr; // bound to `stream`
  int sm_count = 0;
};

// The process's context, created on first use: GPU = (local rank on the node) mod (GPUs
// visible), so ranks of one node spread over its GPUs and several ranks may share one.
// Throws parm::InvalidConfig when no GPU is visible.
Context& context();
inline cudaStream_t stream() { return context().stream; }

// Blocks for a kernel over n elements (grid-stride loops cover the rest).
inline unsigned grid_for(long long n, int block = 256) {
  long long g = (n + block - 1) / block;
  if (g < 1) g = 1;
  if (g > 65535LL * 32) g = 65535LL * 32;
  return static_cast<unsigned>(g);
}

}  // namespace parm::cuda
