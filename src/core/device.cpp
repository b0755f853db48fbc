// Device and precision names, the up-front check of a --device / --precision choice, and
// the device-memory boundary of a build without CUDA (src/kernels/cuda/runtime.cpp has the
// CUDA one).
#include "parm/device.h"

#include "parm/error.h"

namespace parm {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw InvalidConfig(fmt::format("unknown device '{}': valid devices are cpu, cuda", name));
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw InvalidConfig(fmt::format("unknown precision '{}': valid precisions are fp32, bf16", name));
}

void check_device(Device d, Precision p) {
  if (d != Device::kCuda) return;
  PARM_CONFIG_CHECK(cuda_built(),
                    "--device cuda: this build has no CUDA backend (configure with "
                    "-DPARM_CUDA=ON on a machine with the CUDA toolkit, cuBLAS and NCCL); "
                    "use --device cpu");
  PARM_CONFIG_CHECK(cuda_device_count() > 0,
                    "--device cuda: no CUDA GPU is visible to this process; use --device cpu");
}

#ifndef PARM_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda() {
  throw InvalidConfig(
      "device memory requested, but this build has no CUDA backend (configure with "
      "-DPARM_CUDA=ON)");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
void* device_alloc(size_t) { no_cuda(); }
void device_free(void*) {}
void device_zero(void*, size_t) { no_cuda(); }
void device_copy(void*, const void*, size_t) { no_cuda(); }
void device_sync() {}
#endif

}  // namespace parm
