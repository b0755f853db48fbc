#include "dlpack_tensor.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "parm/error.h"
#ifdef PARM_HAVE_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace parm::py_dlpack {
namespace {

std::string dtype_name(DLDataType t) {
  const char* kind = t.code == kDLFloat    ? "float"
                     : t.code == kDLInt    ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLBfloat ? "bfloat"
                                           : nullptr;
  std::string s = kind != nullptr ? fmt::format("{}{}", kind, t.bits)
                                  : fmt::format("code {} of {} bits", int{t.code}, int{t.bits});
  return t.lanes == 1 ? s : fmt::format("{} x {} lanes", s, int{t.lanes});
}

std::string device_str(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return fmt::format("cuda:{}", d.device_id);
    case kDLCUDAHost: return "cuda pinned host memory";
    case kDLCUDAManaged: return "cuda managed memory";
    default: return fmt::format("DLPack device type {}", static_cast<int>(d.device_type));
  }
}

// Row-major contiguous, as torch's is_contiguous(): size-1 dimensions may have any stride.
bool contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;  // DLPack: null strides mean compact row-major
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

}  // namespace

int cuda_ordinal() {
#ifdef PARM_HAVE_CUDA
  return cuda::context().device;
#else
  throw InvalidConfig("this Parm build has no CUDA backend (configure with -DPARM_CUDA=ON)");
#endif
}

uintptr_t cuda_stream() {
#ifdef PARM_HAVE_CUDA
  cudaStream_t s = cuda::stream();
  return s == nullptr ? 1 : reinterpret_cast<uintptr_t>(s);
#else
  throw InvalidConfig("this Parm build has no CUDA backend (configure with -DPARM_CUDA=ON)");
#endif
}

Tensor view(const pybind11::capsule& capsule, const char* op, const char* what, Device device,
            const Shape& shape) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  PARM_CONFIG_CHECK(name != nullptr && std::string(name) == "dltensor",
                    "{}: {} is a capsule named '{}', not a DLPack tensor ('dltensor'; a "
                    "capsule is consumed once)",
                    op, what, name == nullptr ? "" : name);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), name));
  if (managed == nullptr) throw pybind11::error_already_set();
  const DLTensor& t = managed->dl_tensor;
  const std::vector<int64_t> got(t.shape, t.shape + t.ndim);
  PARM_CONFIG_CHECK(t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1,
                    "{}: {} has dtype {}; Parm takes float32 (torch.float32: convert with "
                    ".float())",
                    op, what, dtype_name(t.dtype));
  const bool on_cpu = t.device.device_type == kDLCPU;
  const bool on_cuda = t.device.device_type == kDLCUDA;
  if (device == Device::kCpu) {
    PARM_CONFIG_CHECK(on_cpu, "{}: {} is on {}; the layer computes on cpu "
                      "(parm.init(device='cpu')): move it with .cpu()",
                      op, what, device_str(t.device));
  } else {
    const int mine = cuda_ordinal();
    PARM_CONFIG_CHECK(on_cuda && t.device.device_id == mine,
                      "{}: {} is on {}; this rank computes on cuda:{} (parm.init(device="
                      "'cuda')): move it with .to('cuda:{}')",
                      op, what, device_str(t.device), mine, mine);
  }
  PARM_CONFIG_CHECK(contiguous(t),
                    "{}: {} with shape {} and strides {} is not contiguous; Parm computes on "
                    "the tensor's own memory without copying it: pass .contiguous()",
                    op, what, got,
                    std::vector<int64_t>(t.strides, t.strides + t.ndim));
  PARM_CONFIG_CHECK(shape.empty() || got == shape, "{}: {} has shape {}, expected {}", op, what,
                    got, shape);
  auto* data = reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
  return Tensor::view(data, got, device);
}

}  // namespace parm::py_dlpack
