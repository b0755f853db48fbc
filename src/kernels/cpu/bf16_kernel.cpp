// Which bf16 GEMM kernel runs: the one forced by set_bf16_kernel or, at the first call, by
// PARM_BF16_KERNEL; else the fastest this CPU has, found by asking the CPU (cpuid) and the
// OS (AMX tile permission) at run time; and what `parm info` says about it.
#include <atomic>
#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

// Refuses a kernel whose instructions this CPU lacks; `how` names who asked for it.
void check_runnable(Bf16Kernel kernel, const char* how) {
  PARM_CONFIG_CHECK(kernel != Bf16Kernel::kAmx || detail::amx_usable(),
                    "bf16 kernel: AMX requested ({}), but this CPU or kernel offers no AMX "
                    "bf16 tiles ({})",
                    how, cpu_bf16_capability());
  PARM_CONFIG_CHECK(kernel != Bf16Kernel::kAvx512 || detail::have_avx512_bf16(),
                    "bf16 kernel: AVX512-BF16 requested ({}), but this CPU lacks it ({})", how,
                    cpu_bf16_capability());
}

// PARM_BF16_KERNEL: unset, empty or "auto" leaves the choice to the CPU.
Bf16Kernel kernel_from_env() {
  const char* v = std::getenv("PARM_BF16_KERNEL");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Bf16Kernel::kAuto;
  Bf16Kernel kernel = Bf16Kernel::kAuto;
  if (std::strcmp(v, "amx") == 0) {
    kernel = Bf16Kernel::kAmx;
  } else if (std::strcmp(v, "avx512") == 0) {
    kernel = Bf16Kernel::kAvx512;
  } else if (std::strcmp(v, "fp32") == 0) {
    kernel = Bf16Kernel::kFp32;
  } else if (std::strcmp(v, "portable") == 0) {
    kernel = Bf16Kernel::kPortable;
  } else {
    throw InvalidConfig(fmt::format(
        "PARM_BF16_KERNEL={}: valid values are auto, amx, avx512, fp32, portable", v));
  }
  check_runnable(kernel, "PARM_BF16_KERNEL");
  return kernel;
}

// The forced kernel (kAuto: none); PARM_BF16_KERNEL is read once, at the first bf16 GEMM or
// query, and set_bf16_kernel replaces it.
std::atomic<Bf16Kernel>& forced_kernel() {
  static std::atomic<Bf16Kernel> kernel{kernel_from_env()};
  return kernel;
}

}  // namespace

Bf16Kernel detail::bf16_kernel_in_use() {
  const Bf16Kernel forced = forced_kernel().load(std::memory_order_relaxed);
  if (forced != Bf16Kernel::kAuto) return forced;
  if (amx_usable()) return Bf16Kernel::kAmx;
  if (have_avx512_bf16()) return Bf16Kernel::kAvx512;
  return Bf16Kernel::kFp32;
}

bool detail::bf16_portable_forced() {
  const Bf16Kernel forced = forced_kernel().load(std::memory_order_relaxed);
  return forced == Bf16Kernel::kPortable || forced == Bf16Kernel::kFp32;
}

void set_bf16_kernel(Bf16Kernel kernel) {
  check_runnable(kernel, "set_bf16_kernel");
  forced_kernel().store(kernel, std::memory_order_relaxed);
}

const char* bf16_kernel_name() {
  switch (detail::bf16_kernel_in_use()) {
    case Bf16Kernel::kAmx: return "parm AMX tiles (amx_bf16, fp32 accumulation)";
    case Bf16Kernel::kAvx512:
      return "parm AVX512-BF16 (vdpbf16ps, no AMX; fp32 accumulation)";
    case Bf16Kernel::kFp32:
      return "parm fp32 GEMM over widened bf16 (no AMX or AVX512-BF16 in use: bf16 operands "
             "widened to fp32, oneDNN's fp32 GEMM, fp32 accumulation)";
    default:
      return "parm portable C++ reference loop (forced; bf16 widened to fp32, fp32 "
             "accumulation)";
  }
}

const char* cpu_bf16_capability() {
  static const std::string text = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    bool avx512_bf16 = false, amx_bf16 = false;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0) {
      amx_bf16 = ((edx >> 22) & 1u) && ((edx >> 24) & 1u);
      if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) avx512_bf16 = (eax >> 5) & 1u;
    }
    std::string s = fmt::format("avx512_bf16 {}, amx_bf16 {}", avx512_bf16 ? "yes" : "no",
                                amx_bf16 ? "yes" : "no");
    if (amx_bf16) s += detail::amx_usable() ? " (tiles granted)" : " (tiles refused by the OS)";
    return s;
  }();
  return text.c_str();
}

}  // namespace parm::cpu
