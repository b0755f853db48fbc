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

cudaDataType_t operand_type(GemmType t) { return t == GemmType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }
cudaDataType_t output_type(GemmType t) {
  return t == GemmType::kBf16ToBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

int to_int(int64_t v, const char* what) {
  PARM_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
             "cuBLAS GEMM: {} = {} does not fit cuBLAS's int arguments", what, v);
  return static_cast<int>(v);
}

// The products cuBLAS need not see: m or n == 0 (nothing to write) and k == 0 (C = 0, or C
// unchanged when accumulating; BLAS would give beta * C too, but that is not worth relying
// on). Returns true when the product is done.
bool empty_product(int64_t m, int64_t n, int64_t k, void* c, bool accumulate, GemmType type) {
  PARM_CHECK(m >= 0 && n >= 0 && k >= 0, "cuBLAS GEMM: negative size m={} n={} k={}", m, n, k);
  if (m == 0 || n == 0) return true;
  if (k > 0) return false;
  if (!accumulate) device_zero(c, static_cast<size_t>(m * n) * output_bytes(type));
  return true;
}

// One cublasGemmEx of a product with m, n, k > 0.
void gemm_ex(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
             const void* b, void* c, bool accumulate, GemmType type) {
  const ColumnMajorGemm g = column_major_gemm(trans_a, trans_b, m, n, k);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;  // beta = 0: C is not read
  const cudaDataType_t t = operand_type(type);
  PARM_CUBLAS_CHECK(cublasGemmEx(context().cublas, op(g.trans_first), op(g.trans_second),
                                 to_int(g.m, "n"), to_int(g.n, "m"), to_int(g.k, "k"), &alpha, b, t,
                                 to_int(g.ld_first, "ldb"), a, t, to_int(g.ld_second, "lda"), &beta,
                                 c, output_type(type), to_int(g.ldc, "ldc"), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          void* c, bool accumulate, GemmType type) {
  if (empty_product(m, n, k, c, accumulate, type)) return;
  gemm_ex(trans_a, trans_b, m, n, k, a, b, c, accumulate, type);
}

// Host arrays of one grouped call (gemm_args.h), and cuBLAS's per-group arrays made from them.
struct GroupedGemm::Scratch {
  GroupedGemmArgs args;
  std::vector<const void*> pointers;  // (3, products): cuBLAS's A (our B), B (our A), C
  std::vector<cublasOperation_t> trans_first, trans_second;
  std::vector<int> m, n, k, ld_first, ld_second, ldc, group_size;
  std::vector<float> alpha, beta;

  explicit Scratch(int64_t cap) {
    const size_t c = static_cast<size_t>(cap);
    args.reserve(c);
    pointers.reserve(3 * c);
    for (auto* v : {&trans_first, &trans_second}) v->reserve(c);
    for (auto* v : {&m, &n, &k, &ld_first, &ld_second, &ldc, &group_size}) v->reserve(c);
    alpha.reserve(c);
    beta.reserve(c);
  }
  // Sizes every per-group array to `groups` entries (within the reserved capacity).
  void resize(size_t groups) {
    for (auto* v : {&trans_first, &trans_second}) v->resize(groups);
    for (auto* v : {&m, &n, &k, &ld_first, &ld_second, &ldc, &group_size}) v->resize(groups);
    alpha.resize(groups);
    beta.resize(groups);
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
  last_groups_ = 0;
  Scratch& s = *scratch_;
  // The products with k == 0 are done here; plan_grouped_gemm leaves them and the empty ones
  // out.
  for (int64_t i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    (void)empty_product(p.m, p.n, p.k, p.c, accumulate, type);
  }
  GroupedGemmArgs& a = s.args;
  plan_grouped_gemm(trans_a, trans_b, problems, count, a);
  const size_t num = static_cast<size_t>(a.num_products());
  if (num == 0) return;
  const int ti = static_cast<int>(type);
  const bool grouped =
      PARM_HAVE_GROUPED_GEMM && mode_ == Mode::kAuto && grouped_supported_[ti] && num >= 2;
  if (grouped) {
#if PARM_HAVE_GROUPED_GEMM
    const size_t groups = static_cast<size_t>(a.num_groups());
    s.resize(groups);
    for (size_t g = 0; g < groups; ++g) {
      const ColumnMajorGemm& c = a.groups[g];
      s.trans_first[g] = op(c.trans_first);
      s.trans_second[g] = op(c.trans_second);
      s.m[g] = to_int(c.m, "n");
      s.n[g] = to_int(c.n, "m");
      s.k[g] = to_int(c.k, "k");
      s.ld_first[g] = to_int(c.ld_first, "ldb");
      s.ld_second[g] = to_int(c.ld_second, "lda");
      s.ldc[g] = to_int(c.ldc, "ldc");
      s.group_size[g] = a.group_size[g];
      s.alpha[g] = 1.0f;
      s.beta[g] = accumulate ? 1.0f : 0.0f;
    }
    s.pointers.resize(3 * num);
    for (size_t i = 0; i < num; ++i) {
      s.pointers[i] = a.first[i];
      s.pointers[num + i] = a.second[i];
      s.pointers[2 * num + i] = a.c[i];
    }
    // The kernel that writes the pointer arrays runs before the GEMM on the same stream, and
    // after any earlier call that read them.
    store_pointers(s.pointers.data(), static_cast<int64_t>(3 * num), device_pointers_);
    const void* const* first = device_pointers_;
    const void* const* second = device_pointers_ + num;
    void* const* c = device_pointers_ + 2 * num;
    const cudaDataType_t t = operand_type(type);
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        context().cublas, s.trans_first.data(), s.trans_second.data(), s.m.data(), s.n.data(),
        s.k.data(), s.alpha.data(), first, t, s.ld_first.data(), second, t, s.ld_second.data(),
        s.beta.data(), c, output_type(type), s.ldc.data(), static_cast<int>(groups),
        s.group_size.data(), CUBLAS_COMPUTE_32F);
    const bool refused =
        status == CUBLAS_STATUS_NOT_SUPPORTED ||
        (type == GemmType::kBf16 && status == CUBLAS_STATUS_INVALID_VALUE);
    if (!refused) {
      PARM_CUBLAS_CHECK(status);
      last_groups_ = static_cast<int64_t>(groups);
      return;
    }
    grouped_supported_[ti] = false;  // fall through to the loop, now and from now on
#endif
  }
  for (size_t i = 0; i < num; ++i) {
    const GemmProblem& p = problems[a.order[i]];
    gemm_ex(trans_a, trans_b, p.m, p.n, p.k, p.a, p.b, p.c, accumulate, type);
  }
}

}  // namespace parm::cuda
