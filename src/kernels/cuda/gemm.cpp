// Row-major GEMMs on cuBLAS: the argument mapping is gemm_args.h (unit-tested on the CPU);
// here are the calls, the empty-product cases and the grouped path.
#include "kernels/cuda/gemm.h"

#include <limits>
#include <vector>

#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/gemm_args.h"
#include "kernels/cuda/runtime.h"
#include "parm/device.h"
#include "parm/error.h"

// cublasGemmGroupedBatchedEx appeared in cuBLAS 12.5; older toolkits run the loop.
#if CUBLAS_VERSION >= 120500
#define PARM_HAVE_GROUPED_GEMM 1
#else
#define PARM_HAVE_GROUPED_GEMM 0
#endif

namespace parm::cuda {
namespace {

cudaDataType_t operand_type(GemmType t) { return t == GemmType::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

int to_int(int64_t v, const char* what) {
  PARM_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
             "cuBLAS GEMM: {} = {} does not fit cuBLAS's int arguments", what, v);
  return static_cast<int>(v);
}

// The products cuBLAS need not see: m or n == 0 (nothing to write) and k == 0 (C = 0, or C
// unchanged when accumulating; BLAS would give beta * C too, but that is not worth relying
// on). Returns true when the product is done.
bool empty_product(int64_t m, int64_t n, int64_t k, float* c, bool accumulate) {
  PARM_CHECK(m >= 0 && n >= 0 && k >= 0, "cuBLAS GEMM: negative size m={} n={} k={}", m, n, k);
  if (m == 0 || n == 0) return true;
  if (k > 0) return false;
  if (!accumulate) device_zero(c, static_cast<size_t>(m * n) * sizeof(float));
  return true;
}

// One cublasGemmEx of a product with m, n, k > 0.
void gemm_ex(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
             const void* b, float* c, bool accumulate, GemmType type) {
  const ColumnMajorGemm g = column_major_gemm(trans_a, trans_b, m, n, k);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;  // beta = 0: C is not read
  const cudaDataType_t t = operand_type(type);
  PARM_CUBLAS_CHECK(cublasGemmEx(
      context().cublas, op(g.trans_first), op(g.trans_second), to_int(g.m, "n"), to_int(g.n, "m"),
      to_int(g.k, "k"), &alpha, b, t, to_int(g.ld_first, "ldb"), a, t, to_int(g.ld_second, "lda"),
      &beta, c, CUDA_R_32F, to_int(g.ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          float* c, bool accumulate, GemmType type) {
  if (empty_product(m, n, k, c, accumulate)) return;
  gemm_ex(trans_a, trans_b, m, n, k, a, b, c, accumulate, type);
}

// Host arrays of one grouped call: one group (of size 1) per non-empty product.
struct GroupedGemm::Scratch {
  std::vector<GemmProblem> active;
  std::vector<const void*> pointers;  // (3, active): cuBLAS's A (our B), B (our A), C
  std::vector<cublasOperation_t> trans_first, trans_second;
  std::vector<int> m, n, k, ld_first, ld_second, ldc, group_size;
  std::vector<float> alpha, beta;

  explicit Scratch(int64_t cap) {
    const size_t c = static_cast<size_t>(cap);
    active.reserve(c);
    pointers.reserve(3 * c);
    for (auto* v : {&trans_first, &trans_second}) v->reserve(c);
    for (auto* v : {&m, &n, &k, &ld_first, &ld_second, &ldc, &group_size}) v->reserve(c);
    alpha.reserve(c);
    beta.reserve(c);
  }
  // Sizes every array to `num` entries (within the reserved capacity: no allocation).
  void resize(size_t num) {
    pointers.resize(3 * num);
    for (auto* v : {&trans_first, &trans_second}) v->resize(num);
    for (auto* v : {&m, &n, &k, &ld_first, &ld_second, &ldc, &group_size}) v->resize(num);
    alpha.resize(num);
    beta.resize(num);
  }
};

GroupedGemm::GroupedGemm(int64_t max_problems)
    : max_problems_(max_problems), scratch_(std::make_unique<Scratch>(max_problems)) {
  PARM_CHECK(max_problems >= 1, "GroupedGemm: max_problems = {}", max_problems);
  cublasPointerMode_t mode = CUBLAS_POINTER_MODE_HOST;
  PARM_CUBLAS_CHECK(cublasGetPointerMode(context().cublas, &mode));
  PARM_CHECK(mode == CUBLAS_POINTER_MODE_HOST,
             "GroupedGemm: the process's cuBLAS handle must keep host pointer mode (alpha and "
             "beta are host values)");
  device_pointers_ =
      static_cast<void**>(device_alloc(static_cast<size_t>(3 * max_problems) * sizeof(void*)));
}

GroupedGemm::~GroupedGemm() { device_free(device_pointers_); }

void GroupedGemm::run(bool trans_a, bool trans_b, bool accumulate, GemmType type,
                      const GemmProblem* problems, int64_t count) {
  PARM_CHECK(count >= 0 && count <= max_problems_, "GroupedGemm: {} products, sized for at most {}",
             count, max_problems_);
  Scratch& s = *scratch_;
  s.active.clear();
  for (int64_t i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    if (!empty_product(p.m, p.n, p.k, p.c, accumulate)) s.active.push_back(p);
  }
  const size_t num = s.active.size();
  if (num == 0) return;
  const bool grouped = PARM_HAVE_GROUPED_GEMM && type == GemmType::kF32 && mode_ == Mode::kAuto &&
                       grouped_supported_ && num >= 2;
  if (grouped) {
#if PARM_HAVE_GROUPED_GEMM
    s.resize(num);
    for (size_t i = 0; i < num; ++i) {
      const GemmProblem& p = s.active[i];
      const ColumnMajorGemm g = column_major_gemm(trans_a, trans_b, p.m, p.n, p.k);
      s.pointers[i] = p.b;
      s.pointers[num + i] = p.a;
      s.pointers[2 * num + i] = p.c;
      s.trans_first[i] = op(g.trans_first);
      s.trans_second[i] = op(g.trans_second);
      s.m[i] = to_int(g.m, "n");
      s.n[i] = to_int(g.n, "m");
      s.k[i] = to_int(g.k, "k");
      s.ld_first[i] = to_int(g.ld_first, "ldb");
      s.ld_second[i] = to_int(g.ld_second, "lda");
      s.ldc[i] = to_int(g.ldc, "ldc");
      s.group_size[i] = 1;
      s.alpha[i] = 1.0f;
      s.beta[i] = accumulate ? 1.0f : 0.0f;
    }
    // The kernel that writes the pointer arrays runs before the GEMM on the same stream, and
    // after any earlier call that read them.
    store_pointers(s.pointers.data(), static_cast<int64_t>(3 * num), device_pointers_);
    const void* const* first = device_pointers_;
    const void* const* second = device_pointers_ + num;
    void* const* c = device_pointers_ + 2 * num;
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        context().cublas, s.trans_first.data(), s.trans_second.data(), s.m.data(), s.n.data(),
        s.k.data(), s.alpha.data(), first, CUDA_R_32F, s.ld_first.data(), second, CUDA_R_32F,
        s.ld_second.data(), s.beta.data(), c, CUDA_R_32F, s.ldc.data(), static_cast<int>(num),
        s.group_size.data(), CUBLAS_COMPUTE_32F);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
      PARM_CUBLAS_CHECK(status);
      return;
    }
    grouped_supported_ = false;  // fall through to the loop, now and from now on
#endif
  }
  for (const GemmProblem& p : s.active)
    gemm_ex(trans_a, trans_b, p.m, p.n, p.k, p.a, p.b, p.c, accumulate, type);
}

}  // namespace parm::cuda
