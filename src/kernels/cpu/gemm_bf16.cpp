// The bf16 GEMM: argument checks, the call of the kernel in use (bf16_kernel.cpp chooses it:
// AMX in gemm_bf16_amx.cpp, AVX512-BF16 in gemm_bf16_avx512.cpp, the fp32 GEMM over widened
// operands in gemm_bf16_fp32.cpp, or the portable scalar loop below), the convenience forms
// over fp32 operands, and the implementation oneDNN would pick for a bf16 matmul.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/dnnl_check.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::cpu {

using detail::kTileK;
using detail::kTileRows;
using detail::round_up;

namespace {

// The reference kernel: the same sums as the AMX kernel, one row of C and one 16-column panel
// at a time, in fp32 (products of two bf16 values are exact in fp32; only the order of the
// sum differs). Scalar, about 20x slower than the fp32 GEMM: only forced (kPortable) runs it.
void gemm_bf16_portable(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                        float* c, int64_t ldc, bool accumulate) {
  const int64_t kp = round_up(k, kTileK), pairs = kp / 2;
  const int64_t panels = round_up(n, kTileRows) / kTileRows;
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* arow = a + detail::packed_a_offset(i, 0, kp);  // k chunks 512 apart
    for (int64_t jp = 0; jp < panels; ++jp) {
      const uint16_t* panel = b + jp * pairs * 2 * kTileRows;
      float acc[kTileRows] = {};
      for (int64_t p = 0; p < pairs; ++p) {
        const uint16_t* ak = arow + (2 * p / kTileK) * kTileRows * kTileK + 2 * p % kTileK;
        const float a0 = bf16_to_f32(ak[0]), a1 = bf16_to_f32(ak[1]);
        const uint16_t* row = panel + p * 2 * kTileRows;
        for (int64_t jj = 0; jj < kTileRows; ++jj)
          acc[jj] += a0 * bf16_to_f32(row[2 * jj]) + a1 * bf16_to_f32(row[2 * jj + 1]);
      }
      const int64_t j0 = jp * kTileRows, width = std::min<int64_t>(kTileRows, n - j0);
      float* out = c + i * ldc + j0;
      for (int64_t jj = 0; jj < width; ++jj) out[jj] = (accumulate ? out[jj] : 0.0f) + acc[jj];
    }
  }
}

struct PackScratch {
  Bf16Buffer a, b;
};

}  // namespace

std::string onednn_bf16_matmul_impl() {
  // A 256^3 bf16 x bf16 -> fp32 matmul: oneDNN names the implementation it picks.
  dnnl_engine_t engine = nullptr;
  PARM_DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
  const dnnl_dims_t dims = {256, 256};
  dnnl_memory_desc_t a_md, b_md, c_md;
  dnnl_primitive_desc_t pd = nullptr;
  std::string impl;
  try {
    PARM_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&a_md, 2, dims, dnnl_bf16, dnnl_ab));
    PARM_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&b_md, 2, dims, dnnl_bf16, dnnl_ab));
    PARM_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&c_md, 2, dims, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    PARM_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md));
    const dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, nullptr, engine, nullptr);
    if (st != dnnl_success) {
      impl = fmt::format("none (oneDNN status {})", dnnl_status2str(st));
    } else {
      const char* info = nullptr;
      PARM_DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info));
      impl = info != nullptr ? info : "unknown";
    }
  } catch (...) {
    if (pd != nullptr) dnnl_primitive_desc_destroy(pd);
    dnnl_engine_destroy(engine);
    throw;
  }
  if (pd != nullptr) dnnl_primitive_desc_destroy(pd);
  dnnl_engine_destroy(engine);
  return impl;
}

void gemm_bf16_packed(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                      float* c, int64_t ldc, bool accumulate) {
  PARM_CHECK(m >= 0 && n >= 0 && k >= 0 && ldc >= std::max<int64_t>(1, n),
             "gemm_bf16: m = {}, n = {}, k = {}, ldc = {}", m, n, k, ldc);
  if (detail::gemm_done_without_products("gemm_bf16", m, n, k, a, b, c, ldc, accumulate)) return;
  switch (detail::bf16_kernel_in_use()) {
    case Bf16Kernel::kAmx: detail::gemm_bf16_amx(m, n, k, a, b, c, ldc, accumulate); break;
    case Bf16Kernel::kAvx512: detail::gemm_bf16_avx512(m, n, k, a, b, c, ldc, accumulate); break;
    case Bf16Kernel::kFp32: detail::gemm_bf16_fp32(m, n, k, a, b, c, ldc, accumulate); break;
    default: gemm_bf16_portable(m, n, k, a, b, c, ldc, accumulate);
  }
}

namespace {

// Per thread, grown to the largest operands seen (the steady state allocates nothing).
PackScratch& pack_scratch() {
  thread_local PackScratch scratch;
  return scratch;
}

}  // namespace

void gemm_bf16_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
                        int64_t lda, const uint16_t* packed_b, float* c, int64_t ldc,
                        bool accumulate) {
  if (m == 0 || n == 0 || k == 0) {
    gemm_bf16_packed(m, n, k, nullptr, nullptr, c, ldc, accumulate);
    return;
  }
  Bf16Buffer& pa = pack_scratch().a;
  const auto a_size = static_cast<size_t>(bf16_packed_a_size(m, k));
  if (pa.size() < a_size) pa.resize(a_size);
  bf16_pack_a(trans_a, m, k, a, lda, pa.data());
  gemm_bf16_packed(m, n, k, pa.data(), packed_b, c, ldc, accumulate);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0 || k == 0) {
    gemm_bf16_packed(m, n, k, nullptr, nullptr, c, ldc, accumulate);
    return;
  }
  Bf16Buffer& pb = pack_scratch().b;
  const auto b_size = static_cast<size_t>(bf16_packed_b_size(k, n));
  if (pb.size() < b_size) pb.resize(b_size);
  bf16_pack_b(trans_b, k, n, b, ldb, pb.data());
  gemm_bf16_packed_b(trans_a, m, n, k, a, lda, pb.data(), c, ldc, accumulate);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               const float* b, float* c, bool accumulate) {
  const auto ld = [](int64_t width) { return std::max<int64_t>(1, width); };
  gemm_bf16(trans_a, trans_b, m, n, k, a, ld(trans_a ? m : k), b, ld(trans_b ? k : n), c, ld(n),
            accumulate);
}

}  // namespace parm::cpu
