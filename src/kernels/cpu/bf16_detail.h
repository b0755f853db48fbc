// Private to the CPU kernels: the packed bf16 layouts, the kernels that read them
// (gemm_bf16.cpp calls the one bf16_kernel_in_use() names) and the CPU's bf16 features. The
// layouts are documented with bf16_packed_a_size / bf16_packed_b_size in kernels.h.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernels.h"
#include "kernels/math/bf16_round.h"

namespace parm::cpu::detail {

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Packed A: (round_up(m, 16), round_up(k, 32)) as 16 x 32 tiles, each 1 KiB contiguous
// (row-major inside), a 16-row block's tiles in order of k, then the next block. Packed B:
// round_up(n, 16) / 16 column panels, each (round_up(k, 32) / 2, 16, 2).
constexpr int64_t kTileRows = 16;  // rows of an AMX tile; columns of a B panel
constexpr int64_t kTileK = 32;     // bf16 values in one 64-byte tile row

// Where op(A)[i][kk] lies in packed A (kp = round_up(k, 32)). Contiguous tiles let the AMX
// kernel load each one with a 64-byte stride: rows kp * 2 bytes apart (4 KiB at k = 2048)
// fell into a few L1 sets and evicted each other (the kernel ran ~20% slower).
inline int64_t packed_a_offset(int64_t i, int64_t kk, int64_t kp) {
  return (i / kTileRows) * kTileRows * kp + (kk / kTileK) * kTileRows * kTileK +
         (i % kTileRows) * kTileK + kk % kTileK;
}

// fp32 <-> bf16: f32_to_bf16 / bf16_to_f32 (kernels/math/bf16_round.h).

// True when this CPU has AVX512-BF16 (VCVTNE2PS2BF16) with AVX512-F and -BW; asked once.
bool have_avx512_bf16();
// True while kPortable or kFp32 is forced (set_bf16_kernel, PARM_BF16_KERNEL): the packing
// runs its scalar loops too, as on a CPU without AVX512-BF16.
bool bf16_portable_forced();
// The kernel gemm_bf16_packed runs now: the forced one, else AMX where usable, else
// AVX512-BF16 where present, else kFp32 (bf16_kernel.cpp); never kAuto.
Bf16Kernel bf16_kernel_in_use();
// True when this CPU has AMX bf16 tiles and the kernel granted this process their state
// (Linux arch_prctl ARCH_REQ_XCOMP_PERM); asked once.
bool amx_usable();
// C (m, n) (+)= A B over packed operands with AMX tiles. Requires amx_usable().
void gemm_bf16_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                   float* c, int64_t ldc, bool accumulate);
// The same with AVX512-BF16 (vdpbf16ps) on the same packed operands. Requires
// have_avx512_bf16().
void gemm_bf16_avx512(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                      float* c, int64_t ldc, bool accumulate);
// The same by widening the packed operands to fp32 and calling gemm() (gemm_bf16_fp32.cpp):
// runs on any CPU.
void gemm_bf16_fp32(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                    float* c, int64_t ldc, bool accumulate);

}  // namespace parm::cpu::detail
