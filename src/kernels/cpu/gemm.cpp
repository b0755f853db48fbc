// GEMM through oneDNN: argument checks, zero sizes, and the choice between dnnl_sgemm and
// a cached matmul primitive (matmul_cache.cpp).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "kernels/cpu/dnnl_check.h"
#include "kernels/cpu/gemm_args.h"
#include "kernels/cpu/gemm_threads.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/matmul_cache.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

std::atomic<GemmPath> g_path{GemmPath::kAuto};

// Which path is faster depends on the shape, and neither wins everywhere. Measured on one
// core of the development machine (AMD EPYC Zen 4, oneDNN 2.6.3, avx512_core), GFLOP/s
// sgemm vs matmul, best of 5 (differences under ~3% are within the noise):
//   NN: sgemm wins from n = 512 up by 1-7% (expert forward 2048x2048x512: 111 vs 104);
//       matmul at small n (MoE gate 2048x8x512: 38 vs 57; n = 64: 68 vs 76; n = 256: +1-2%).
//   NT (dX = dH W^T): matmul wins for n <= 512 (m = 128..2048, n = 512, k = 2048: +1.5-22%),
//       sgemm for n >= 1024 (+2-9%, though matmul still wins at m <= 256).
//   TN (dW = X^T dY): matmul wins when k < m and n <= 512 (m = 2048, n = 512, k = 128..512:
//       +4-8%; n <= 128: +16-30%), sgemm otherwise (m = 512, n = 2048: +2-13%).
//   TT: matmul (512^3: 111 vs 97).
// The rule is a pure function of the shape, so all ranks take the same path for the same
// GEMM and produce the same bits.
bool prefer_matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  if (trans_a && trans_b) return true;
  if (trans_b) return n <= 512;
  if (trans_a) return n <= 512 && k < m;
  return n <= 256;
}

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "isa " + std::to_string(static_cast<int>(isa));
  }
}

}  // namespace

void set_gemm_path(GemmPath path) { g_path.store(path, std::memory_order_relaxed); }
GemmPath gemm_path() { return g_path.load(std::memory_order_relaxed); }

namespace {

void gemm_impl(GemmPath prefer, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  PARM_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m = {}, n = {}, k = {}", m, n, k);
  // Stored widths: A is (m, k) or (k, m), B is (k, n) or (n, k), C is (m, n).
  const int64_t a_width = trans_a ? m : k;
  const int64_t b_width = trans_b ? k : n;
  PARM_CHECK(lda >= std::max<int64_t>(1, a_width) && ldb >= std::max<int64_t>(1, b_width) &&
                 ldc >= std::max<int64_t>(1, n),
             "gemm: leading dimension below the stored row width: trans_a = {}, trans_b = {}, "
             "m = {}, n = {}, k = {}, lda = {} (>= {}), ldb = {} (>= {}), ldc = {} (>= {})",
             trans_a, trans_b, m, n, k, lda, a_width, ldb, b_width, ldc, n);
  if (detail::gemm_done_without_products("gemm", m, n, k, a, b, c, ldc, accumulate)) return;

  const int num_threads = detail::apply_gemm_threads();
  const GemmPath forced = gemm_path();
  const GemmPath path = forced != GemmPath::kAuto ? forced : prefer;
  const bool use_matmul = path == GemmPath::kMatmul ||
                          (path == GemmPath::kAuto && prefer_matmul(trans_a, trans_b, m, n, k));
  if (use_matmul) {
    detail::matmul_cached(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate,
                          num_threads);
  } else {
    // dnnl_sgemm is row-major (since oneDNN 1.0), like our contract.
    PARM_DNNL_CHECK(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b,
                               ldb, accumulate ? 1.0f : 0.0f, c, ldc));
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_impl(GemmPath::kAuto, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* c, bool accumulate, GemmPath prefer) {
  const auto ld = [](int64_t width) { return std::max<int64_t>(1, width); };
  gemm_impl(prefer, trans_a, trans_b, m, n, k, a, ld(trans_a ? m : k), b, ld(trans_b ? k : n), c,
            ld(n), accumulate);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* c, bool accumulate) {
  gemm(trans_a, trans_b, m, n, k, a, b, c, accumulate, GemmPath::kAuto);
}

const char* gemm_backend() {
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    const char* runtime = v->cpu_runtime == DNNL_RUNTIME_OMP   ? "openmp"
                          : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                               : "other runtime";
    return fmt::format("oneDNN {}.{}.{} (cpu, {}, {}; sgemm + cached matmul)", v->major, v->minor,
                       v->patch, isa_name(dnnl_get_effective_cpu_isa()), runtime);
  }();
  return name.c_str();
}

}  // namespace parm::cpu
