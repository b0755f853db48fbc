// Where tensors live and layers compute: the CPU (always there; the oracle) or a CUDA GPU
// (optional build, -DPARM_CUDA=ON, found automatically when the CUDA toolkit is installed).
//
// Device memory is plain memory on the GPU; the host never dereferences it. The functions
// below are the raw boundary: they throw parm::InvalidConfig in a build without CUDA, and
// parm::Error naming the CUDA call and its message when the runtime fails.
#pragma once

#include <cstddef>
#include <string>

namespace parm {

enum class Device { kCpu, kCuda };
const char* device_name(Device d);  // "cpu", "cuda"
// Parses "cpu" / "cuda"; throws InvalidConfig listing the valid names.
Device parse_device(const std::string& name);

// Precision of the MoE layer's expert products. kBf16: bf16 operands with fp32
// accumulation and fp32 outputs; the master weights, gradients, activations kept for the
// backward pass and every reduction stay fp32 (CUDA: cuBLAS; CPU: AMX tiles where the CPU
// has them, a portable kernel otherwise).
enum class Precision { kFp32, kBf16 };
const char* precision_name(Precision p);  // "fp32", "bf16"
Precision parse_precision(const std::string& name);

// True when this build has the CUDA backend (configured with PARM_CUDA on).
bool cuda_built();
// GPUs this process sees (0 in a build without CUDA, or with no driver / no GPU).
int cuda_device_count();
// Refuses `d` before any work starts when it cannot run here: cuda in a build without CUDA
// or on a machine without a GPU (bf16 runs on either device). Throws InvalidConfig naming
// what is missing and what would work.
void check_device(Device d, Precision p = Precision::kFp32);

// ---- raw device memory (the GPU the process is bound to; see src/kernels/cuda/runtime.h) ----
void* device_alloc(size_t bytes);  // zero-filled
void device_free(void* p);
void device_zero(void* p, size_t bytes);
// Copies between any two of host and device memory (direction found from the pointers).
// Waits for the device's queued work first and returns when the copy is done, so the host
// may read what it copied and reuse what it sent.
void device_copy(void* dst, const void* src, size_t bytes);
// Waits for all work queued on the process's compute stream.
void device_sync();

}  // namespace parm
