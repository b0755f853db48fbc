#include "moe/backend.h"

#include "parm/error.h"

#ifdef PARM_HAVE_CUDA
#include "moe/cuda/cuda_backend.h"
#endif

namespace parm::moe {

std::unique_ptr<LayerBackend> make_backend(Device device, Precision precision,
                                           const BackendSizes& sizes) {
  check_device(device, precision);
  if (device == Device::kCpu) return make_cpu_backend(sizes, precision);
#ifdef PARM_HAVE_CUDA
  return make_cuda_backend(precision, sizes);
#else
  PARM_CHECK(false, "unreachable: check_device accepted cuda in a build without CUDA");
  return nullptr;
#endif
}

}  // namespace parm::moe
