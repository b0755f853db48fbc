// How a buffer's memory space is told (parm/comm.h).
#include "parm/comm.h"

#ifdef PARM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "parm/device.h"

namespace parm {

const char* memory_space_name(MemorySpace s) {
  return s == MemorySpace::kDevice ? "device" : "host";
}

MemorySpace host_space_of(const void*) { return MemorySpace::kHost; }

MemorySpace cuda_space_of(const void* p) {
#ifdef PARM_HAVE_CUDA
  static const bool have_gpu = cuda_device_count() > 0;
  if (!have_gpu) return MemorySpace::kHost;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown pointer: not one the CUDA runtime allocated
    return MemorySpace::kHost;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? MemorySpace::kDevice
                                                                           : MemorySpace::kHost;
#else
  (void)p;
  return MemorySpace::kHost;
#endif
}

}  // namespace parm
