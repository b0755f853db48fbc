// The dense transformer's and the optimizer's device kernels (kernels/cuda/dense_kernels.h)
// against the CPU functions they replace, on random data with odd sizes (rows and columns
// not multiples of 16 or 32, L = 37, a vocabulary of 50257). Skips without a GPU.
//
// Tolerances, as max |gpu - cpu| <= tol * max |cpu| over a whole tensor:
// - fp32: 1e-5. The kernels compute the CPU's expressions, rows in the CPU's lane order
//   (dense_math.h); they differ by the CPU's FMA clones (a few ulp), by cuBLAS against oneDNN
//   (summation order, ~sqrt(k) 2^-24 of the terms) and by the column sums' chunked order
//   (~sqrt(rows) 2^-24). A wrong index, mask or missing term is off by O(1).
// - bf16 products (dense_gemm, linear, attention at kBf16) against the CPU's bf16 products:
//   1e-4 for one product (both round the same operands to bf16; only the accumulation order
//   differs), 1e-2 for the attention, whose probabilities, computed by each side to fp32
//   precision, may round to neighbouring bf16 values before the p v product (2^-8 relative
//   on a term).
// - cross-entropy loss: 1e-6 (1 + |loss|) (fp32 exponentials summed in double on the GPU,
//   fp64 ones on the CPU).
// - exact: LayerNorm's mean (additions in the CPU's lane order), AdamW (the CPU loop is not
//   cloned: no FMA on either side), bf16 widening, gather, the embedding's forward and its
//   backward (the CPU's order of additions, no products), and every result run twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_compare.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/expert_math.h"
#include "model/blocks.h"
#include "model/param.h"
#include "parm/device.h"
#include "parm/error.h"
#include "parm/rng.h"
#include "parm/tensor.h"
#include "train/optimizer.h"

namespace parm::cuda {
namespace {

constexpr uint64_t kSeed = 20261201;
constexpr double kF32Tol = 1e-5;
constexpr double kBf16GemmTol = 1e-4;
constexpr double kBf16AttentionTol = 1e-2;

#define PARM_SKIP_WITHOUT_GPU()                                                \
  do {                                                                         \
    if (parm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
  } while (0)

Tensor host_normal(Shape shape, uint64_t stream, float stddev = 1.0f, float mean = 0.0f) {
  Tensor t(std::move(shape));
  fill_normal(t, kSeed, stream, mean, stddev);
  return t;
}

using gpu_test::expect_close;
using gpu_test::gpu;
using gpu_test::host;
using gpu_test::max_abs;

// A device array of T (indices, tokens, scalars).
template <class T>
struct DeviceArray {
  std::shared_ptr<void> mem;
  int64_t n = 0;
  explicit DeviceArray(const std::vector<T>& h)
      : mem(device_alloc(std::max<size_t>(1, h.size() * sizeof(T))), device_free),
        n(static_cast<int64_t>(h.size())) {
    if (!h.empty()) device_copy(mem.get(), h.data(), h.size() * sizeof(T));
  }
  T* data() const { return static_cast<T*>(mem.get()); }
  std::vector<T> get() const {
    std::vector<T> h(static_cast<size_t>(n));
    if (n > 0) device_copy(h.data(), mem.get(), h.size() * sizeof(T));
    return h;
  }
};

void expect_same_bits(const Tensor& got_device, const Tensor& want, const std::string& what) {
  const Tensor got = host(got_device);
  ASSERT_EQ(got.numel(), want.numel()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(want.bytes())), 0)
      << what << ": not the same bits";
}

struct RowsCols {
  int64_t rows, cols;
};
constexpr RowsCols kShapes[] = {{1, 1}, {37, 29}, {300, 17}, {1000, 50}, {5, 768}};

// ---- Element-wise, bias and bf16 ------------------------------------------------------------

TEST(DenseKernels, BiasAndGeluMatchCpu) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 1;
  for (const RowsCols& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " cols " << s.cols);
    const int64_t n = s.rows * s.cols;
    const Tensor x = host_normal({n}, stream++, 2.0f), bias = host_normal({s.cols}, stream++);
    const Tensor dy = host_normal({n}, stream++), db0 = host_normal({s.cols}, stream++);
    // bias_gelu_forward: pre += bias in place, act = gelu(pre).
    Tensor pre_want = x.clone(), act_want({n});
    cpu::bias_gelu_forward(pre_want.data(), bias.data(), act_want.data(), s.rows, s.cols);
    Tensor pre = gpu(x), act = gpu(Tensor({n})), bias_d = gpu(bias);
    bias_gelu_forward(pre.data(), bias_d.data(), act.data(), s.rows, s.cols);
    expect_close(pre, pre_want, kF32Tol, "bias_gelu_forward pre");
    expect_close(act, act_want, kF32Tol, "bias_gelu_forward act");
    // bias_gelu (x kept) and its adjoint, dbias accumulated onto db0.
    Tensor act2_want({n}), dx_want({n}), db_want = db0.clone();
    cpu::bias_gelu(x.data(), bias.data(), act2_want.data(), s.rows, s.cols);
    cpu::bias_gelu_backward(x.data(), bias.data(), dy.data(), dx_want.data(), db_want.data(),
                            s.rows, s.cols);
    const Tensor xd = gpu(x), dyd = gpu(dy);
    Tensor act2 = gpu(Tensor({n})), dx = gpu(Tensor({n})), db = gpu(db0);
    bias_gelu(xd.data(), bias_d.data(), act2.data(), s.rows, s.cols);
    bias_gelu_backward(xd.data(), bias_d.data(), dyd.data(), dx.data(), db.data(), s.rows, s.cols);
    expect_close(act2, act2_want, kF32Tol, "bias_gelu act");
    expect_close(dx, dx_want, kF32Tol, "bias_gelu_backward dx");
    expect_close(db, db_want, kF32Tol, "bias_gelu_backward dbias");
    // gelu forward / backward, in place.
    Tensor g_want({n}), gd_want({n});
    cpu::gelu_forward(x.data(), g_want.data(), n);
    cpu::gelu_backward(x.data(), dy.data(), gd_want.data(), n);
    Tensor g = gpu(x), gd = gpu(dy);
    gelu_forward(g.data(), g.data(), n);
    gelu_backward(xd.data(), gd.data(), gd.data(), n);
    expect_close(g, g_want, kF32Tol, "gelu_forward in place");
    expect_close(gd, gd_want, kF32Tol, "gelu_backward in place");
    // add_bias, bias_backward (the scratch-free form).
    Tensor y_want = x.clone(), bb_want = db0.clone();
    cpu::add_bias(y_want.data(), bias.data(), s.rows, s.cols);
    cpu::bias_backward(dy.data(), bb_want.data(), s.rows, s.cols);
    Tensor y = gpu(x), bb = gpu(db0);
    add_bias(y.data(), bias_d.data(), s.rows, s.cols);
    bias_backward(dyd.data(), bb.data(), s.rows, s.cols);
    expect_close(y, y_want, kF32Tol, "add_bias");
    expect_close(bb, bb_want, kF32Tol, "bias_backward");
  }
}

TEST(DenseKernels, Bf16WideningIsExact) {
  PARM_SKIP_WITHOUT_GPU();
  const Tensor x = host_normal({1001}, 20, 3.0f);
  std::vector<uint16_t> h(1001);
  Tensor want({1001});
  for (int64_t i = 0; i < 1001; ++i) {
    h[static_cast<size_t>(i)] = expert_math::f32_to_bf16(x[i]);
    want[i] = expert_math::bf16_to_f32(h[static_cast<size_t>(i)]);
  }
  const DeviceArray<uint16_t> hd(h);
  Tensor y = gpu(Tensor({1001}));
  from_bf16(hd.data(), y.data(), 1001);
  expect_same_bits(y, want, "from_bf16");
  // and back: to_bf16 on the device gives the host's rounding.
  const Tensor xd = gpu(x);
  DeviceArray<uint16_t> back(std::vector<uint16_t>(1001, 0));
  to_bf16(xd.data(), back.data(), 1001);
  EXPECT_EQ(back.get(), h);
}

// ---- LayerNorm and softmax ------------------------------------------------------------------

TEST(DenseKernels, LayerNormMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 30;
  for (const RowsCols& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " cols " << s.cols);
    const int64_t n = s.rows * s.cols;
    const Tensor x = host_normal({n}, stream++, 2.0f, 0.5f), dy = host_normal({n}, stream++);
    const Tensor gamma = host_normal({s.cols}, stream++, 0.3f, 1.0f);
    const Tensor beta = host_normal({s.cols}, stream++, 0.1f);
    const Tensor dg0 = host_normal({s.cols}, stream++), dbt0 = host_normal({s.cols}, stream++);
    Tensor y_want({n}), mean_want({s.rows}), rstd_want({s.rows}), dx_want({n});
    Tensor dg_want = dg0.clone(), dbt_want = dbt0.clone();
    cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y_want.data(), mean_want.data(),
                           rstd_want.data(), s.rows, s.cols, 1e-5f);
    cpu::layernorm_backward(dy.data(), x.data(), gamma.data(), mean_want.data(), rstd_want.data(),
                            dx_want.data(), dg_want.data(), dbt_want.data(), s.rows, s.cols);
    const Tensor xd = gpu(x), gd = gpu(gamma), bd = gpu(beta);
    Tensor y = gpu(Tensor({n})), mean = gpu(Tensor({s.rows})), rstd = gpu(Tensor({s.rows}));
    layernorm_forward(xd.data(), gd.data(), bd.data(), y.data(), mean.data(), rstd.data(), s.rows,
                      s.cols, 1e-5f);
    expect_same_bits(mean, mean_want, "mean");
    expect_close(rstd, rstd_want, kF32Tol, "rstd");
    expect_close(y, y_want, kF32Tol, "y");
    // Backward with dx in place over dy (the contract allows it).
    Tensor dx = gpu(dy), dg = gpu(dg0), dbt = gpu(dbt0);
    layernorm_backward(dx.data(), xd.data(), gd.data(), mean.data(), rstd.data(), dx.data(),
                       dg.data(), dbt.data(), s.rows, s.cols);
    expect_close(dx, dx_want, kF32Tol, "dx (in place)");
    expect_close(dg, dg_want, kF32Tol, "dgamma");
    expect_close(dbt, dbt_want, kF32Tol, "dbeta");
  }
}

TEST(DenseKernels, SoftmaxMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 60;
  for (const RowsCols& s : {RowsCols{3, 1}, RowsCols{50, 37}, RowsCols{7, 1000}, RowsCols{3, 50257}}) {
    SCOPED_TRACE(testing::Message() << "rows " << s.rows << " cols " << s.cols);
    const int64_t n = s.rows * s.cols;
    const Tensor x = host_normal({n}, stream++, 4.0f), dy = host_normal({n}, stream++);
    Tensor y_want({n}), dx_want({n});
    cpu::softmax_forward(x.data(), y_want.data(), s.rows, s.cols);
    cpu::softmax_backward(y_want.data(), dy.data(), dx_want.data(), s.rows, s.cols);
    Tensor y = gpu(x);  // in place
    softmax_forward(y.data(), y.data(), s.rows, s.cols);
    expect_close(y, y_want, kF32Tol, "softmax_forward (in place)");
    const Tensor yd = gpu(y_want);
    Tensor dx = gpu(dy);  // in place
    softmax_backward(yd.data(), dx.data(), dx.data(), s.rows, s.cols);
    expect_close(dx, dx_want, kF32Tol, "softmax_backward (in place)");
  }
}

// ---- Rows and embedding -----------------------------------------------------------------------

TEST(DenseKernels, GatherAndScatterAddMatchCpu) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t src_rows = 23, cols = 37, n = 301;
  Rng rng(kSeed, 70);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (auto& i : idx) i = static_cast<int64_t>(rng.next_u32() % (src_rows + 3)) - 3;  // some < 0
  const DeviceArray<int64_t> idx_d(idx);
  const Tensor table = host_normal({src_rows * cols}, 71);
  Tensor g_want({n * cols});
  cpu::gather_rows(table.data(), cols, idx.data(), n, g_want.data());
  const Tensor table_d = gpu(table);
  Tensor g = gpu(host_normal({n * cols}, 72));  // every element must be written
  gather_rows(table_d.data(), cols, idx_d.data(), n, g.data());
  expect_same_bits(g, g_want, "gather_rows");
  // scatter-add of n rows onto src_rows rows, repeated indices, with and without scale.
  const Tensor src = host_normal({n * cols}, 73), scale = host_normal({n}, 74);
  const Tensor src_d = gpu(src), scale_d = gpu(scale);
  for (bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "scaled" : "unscaled");
    Tensor want = table.clone();
    cpu::scatter_add_rows(src.data(), cols, idx.data(), scaled ? scale.data() : nullptr, n,
                          want.data());
    Tensor got = gpu(table), again = gpu(table);
    scatter_add_rows(src_d.data(), cols, idx_d.data(), scaled ? scale_d.data() : nullptr, n,
                     got.data());
    scatter_add_rows(src_d.data(), cols, idx_d.data(), scaled ? scale_d.data() : nullptr, n,
                     again.data());
    expect_close(got, want, kF32Tol, "scatter_add_rows");
    if (!scaled) expect_same_bits(got, want, "scatter_add_rows (additions in the CPU's order)");
    expect_same_bits(again, host(got), "scatter_add_rows run twice");
  }
}

TEST(DenseKernels, EmbeddingMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t B = 3, L = 37, M = 48, V = 101;
  Rng rng(kSeed, 80);
  std::vector<int32_t> tokens(static_cast<size_t>(B * L));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u32() % 20);  // many repeats
  tokens[5] = V - 1;
  const DeviceArray<int32_t> tok_d(tokens);
  const Tensor wte = host_normal({V * M}, 81), wpe = host_normal({L * M}, 82);
  const Tensor dout = host_normal({B * L * M}, 83);
  const Tensor dwte0 = host_normal({V * M}, 84), dwpe0 = host_normal({L * M}, 85);
  Tensor out_want({B * L * M}), dwte_want = dwte0.clone(), dwpe_want = dwpe0.clone();
  model::embedding_forward(tokens.data(), wte.data(), wpe.data(), out_want.data(), B, L, M, V, 0,
                           V);
  model::embedding_backward(tokens.data(), dout.data(), dwte_want.data(), dwpe_want.data(), B, L, M,
                            0, V);
  const Tensor wte_d = gpu(wte), wpe_d = gpu(wpe), dout_d = gpu(dout);
  Tensor out = gpu(Tensor({B * L * M})), dwte = gpu(dwte0), dwpe = gpu(dwpe0);
  embedding_forward(tok_d.data(), wte_d.data(), wpe_d.data(), out.data(), B, L, M, V, 0, V);
  embedding_backward(tok_d.data(), dout_d.data(), dwte.data(), dwpe.data(), B, L, M, 0, V);
  EXPECT_NO_THROW(check_index_errors());
  expect_same_bits(out, out_want, "embedding_forward");
  expect_same_bits(dwte, dwte_want, "embedding_backward dwte (the CPU's order of additions)");
  expect_same_bits(dwpe, dwpe_want, "embedding_backward dwpe");
}

TEST(DenseKernels, BadTokensAndTargetsAreReported) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t B = 2, L = 5, M = 4, V = 7;
  std::vector<int32_t> tokens(static_cast<size_t>(B * L), 1);
  tokens[8] = V;   // sequence 1, position 3: the first bad one
  tokens[9] = -2;  // also bad, later
  const DeviceArray<int32_t> tok_d(tokens);
  const Tensor wte_d = gpu(host_normal({V * M}, 90)), wpe_d = gpu(host_normal({L * M}, 91));
  Tensor out = gpu(Tensor({B * L * M}));
  embedding_forward(tok_d.data(), wte_d.data(), wpe_d.data(), out.data(), B, L, M, V, 0, V);
  try {
    check_index_errors();
    ADD_FAILURE() << "a token outside the vocabulary was not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token 7 at (sequence 1, position 3)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 7)"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_index_errors());  // reported once, then cleared
  // A bad target: no loss for its row, a zero dlogits row, and a report.
  const int64_t n = 3, vocab = 11;
  const DeviceArray<int32_t> targets(std::vector<int32_t>{2, 11, 4});
  const Tensor logits_d = gpu(host_normal({n * vocab}, 92));
  Tensor dl = gpu(host_normal({n * vocab}, 93));
  const DeviceArray<double> loss(std::vector<double>{0.0});
  cross_entropy(logits_d.data(), targets.data(), dl.data(), n, vocab, 1.0f, loss.data());
  EXPECT_THROW(check_index_errors(), Error);
  const Tensor dlh = host(dl);
  for (int64_t c = 0; c < vocab; ++c) EXPECT_EQ(dlh[vocab + c], 0.0f) << "column " << c;
}

// ---- Products -----------------------------------------------------------------------------

TEST(DenseKernels, DenseGemmWithLeadingDimensionsMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 100;
  const int64_t m = 37, n = 29, k = 53;
  for (Precision p : {Precision::kFp32, Precision::kBf16})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          SCOPED_TRACE(testing::Message() << precision_name(p) << " trans_a " << ta << " trans_b "
                                          << tb << " accumulate " << acc);
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
          const Tensor a = host_normal({(ta ? k : m) * lda}, stream++);
          const Tensor b = host_normal({(tb ? n : k) * ldb}, stream++);
          const Tensor c0 = host_normal({m * ldc}, stream++);
          Tensor want = c0.clone();
          model::dense_gemm(p, ta != 0, tb != 0, m, n, k, a.data(), lda, b.data(), ldb, want.data(),
                            ldc, acc != 0);
          const Tensor ad = gpu(a), bd = gpu(b);
          Tensor c = gpu(c0);
          dense_gemm(p, ta != 0, tb != 0, m, n, k, ad.data(), lda, bd.data(), ldb, c.data(), ldc,
                     acc != 0);
          expect_close(c, want, p == Precision::kFp32 ? kF32Tol : kBf16GemmTol, "C");
          // The padding columns of C are never written.
          const Tensor ch = host(c);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(ch[i * ldc + j], c0[i * ldc + j]);
        }
}

TEST(DenseKernels, LinearMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t rows = 45, in = 33, out = 70;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(p));
    const double tol = p == Precision::kFp32 ? kF32Tol : kBf16GemmTol;
    const Tensor x = host_normal({rows * in}, 110), w = host_normal({in * out}, 111, 0.2f);
    const Tensor b = host_normal({out}, 112), dy = host_normal({rows * out}, 113);
    const Tensor dw0 = host_normal({in * out}, 114), db0 = host_normal({out}, 115);
    const Tensor dx0 = host_normal({rows * in}, 116);
    Tensor y_want({rows * out}), dw_want = dw0.clone(), db_want = db0.clone(), dx_want = dx0.clone();
    model::linear_forward(x.data(), w.data(), b.data(), y_want.data(), rows, in, out, p);
    model::linear_backward(dy.data(), x.data(), w.data(), dx_want.data(), dw_want.data(),
                           db_want.data(), rows, in, out, /*accumulate_dx=*/true, p);
    const Tensor xd = gpu(x), wd = gpu(w), bd = gpu(b), dyd = gpu(dy);
    Tensor y = gpu(Tensor({rows * out})), dw = gpu(dw0), db = gpu(db0), dx = gpu(dx0);
    linear_forward(xd.data(), wd.data(), bd.data(), y.data(), rows, in, out, p);
    linear_backward(dyd.data(), xd.data(), wd.data(), dx.data(), dw.data(), db.data(), rows, in,
                    out, true, p);
    expect_close(y, y_want, tol, "y");
    expect_close(dw, dw_want, tol, "dw");
    expect_close(db, db_want, kF32Tol, "db");
    expect_close(dx, dx_want, tol, "dx");
  }
}

// ---- Attention ----------------------------------------------------------------------------

TEST(DenseKernels, AttentionMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, L, heads, D;
  };
  uint64_t stream = 120;
  for (const Case& cs : {Case{2, 37, 3, 16}, Case{1, 1, 1, 8}, Case{2, 130, 2, 64}})
    for (bool causal : {true, false})
      for (Precision p : {Precision::kFp32, Precision::kBf16}) {
        SCOPED_TRACE(testing::Message() << "B " << cs.B << " L " << cs.L << " heads " << cs.heads
                                        << " D " << cs.D << (causal ? " causal " : " full ")
                                        << precision_name(p));
        AttentionShape s;
        s.batch = cs.B;
        s.seq_len = cs.L;
        s.heads = cs.heads;
        s.head_dim = cs.D;
        s.causal = causal;
        s.precision = p;
        const double tol = p == Precision::kFp32 ? kF32Tol : kBf16AttentionTol;
        const int64_t act = cs.B * cs.L * s.width(), np = cs.B * cs.heads * cs.L * cs.L;
        const Tensor q = host_normal({act}, stream++), k = host_normal({act}, stream++);
        const Tensor v = host_normal({act}, stream++), dout = host_normal({act}, stream++);
        Tensor probs_want({np}), out_want({act}), dq_want({act}), dk_want({act}), dv_want({act});
        std::vector<float> dscores(static_cast<size_t>(cs.L * cs.L));
        model::attention_forward(s, q.data(), k.data(), v.data(), probs_want.data(), out_want.data());
        model::attention_backward(s, q.data(), k.data(), v.data(), probs_want.data(), dout.data(),
                                  dq_want.data(), dk_want.data(), dv_want.data(), dscores.data());
        const Tensor qd = gpu(q), kd = gpu(k), vd = gpu(v), doutd = gpu(dout);
        Tensor probs = gpu(host_normal({np}, 999)), out = gpu(host_normal({act}, 998));
        parm::cuda::attention_forward(s, qd.data(), kd.data(), vd.data(), probs.data(), out.data());
        expect_close(probs, probs_want, tol, "probs");
        expect_close(out, out_want, tol, "out");
        if (causal) {  // masked entries exactly 0
          const Tensor ph = host(probs);
          for (int64_t r = 0; r < cs.B * cs.heads * cs.L; ++r)
            for (int64_t j = r % cs.L + 1; j < cs.L; ++j)
              ASSERT_EQ(ph[r * cs.L + j], 0.0f) << "row " << r << " key " << j;
        }
        // The backward pass from the CPU's probs, so that it is checked on its own.
        const Tensor pd = gpu(probs_want);
        Tensor dq = gpu(Tensor({act})), dk = gpu(Tensor({act})), dv = gpu(Tensor({act}));
        parm::cuda::attention_backward(s, qd.data(), kd.data(), vd.data(), pd.data(), doutd.data(), dq.data(),
                           dk.data(), dv.data(), nullptr);
        expect_close(dq, dq_want, tol, "dq");
        expect_close(dk, dk_want, tol, "dk");
        expect_close(dv, dv_want, tol, "dv");
      }
}

// ---- Cross-entropy ------------------------------------------------------------------------

TEST(DenseKernels, CrossEntropyMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 140;
  for (int64_t vocab : {int64_t{1}, int64_t{17}, int64_t{50257}})
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << (in_place ? " in place" : ""));
      const int64_t n = 5;
      const float scale = 1.0f / 7.0f;
      const Tensor logits = host_normal({n * vocab}, stream++, 3.0f, 1.0f);
      std::vector<int32_t> targets(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) targets[r] = static_cast<int32_t>((r * 7919 + 3) % vocab);
      Tensor dl_want({n * vocab});
      const double loss_want = model::cross_entropy(logits.data(), targets.data(), dl_want.data(),
                                                    n, vocab, scale);
      const DeviceArray<int32_t> td(targets);
      const DeviceArray<double> loss(std::vector<double>{1.5});  // accumulated onto
      Tensor ld = gpu(logits), dl = gpu(Tensor({n * vocab}));
      float* dlp = in_place ? ld.data() : dl.data();
      cross_entropy(ld.data(), td.data(), dlp, n, vocab, scale, loss.data());
      check_index_errors();
      const double got = loss.get()[0] - 1.5;
      EXPECT_NEAR(got, loss_want, 1e-6 * (1.0 + std::fabs(loss_want)));
      expect_close(in_place ? ld : dl, dl_want, kF32Tol, "dlogits");
      // Without dlogits: the loss only, logits untouched.
      const DeviceArray<double> loss2(std::vector<double>{1.5});
      const Tensor ld2 = gpu(logits);
      cross_entropy(ld2.data(), td.data(), nullptr, n, vocab, scale, loss2.data());
      EXPECT_EQ(loss2.get()[0], loss.get()[0]) << "the loss depends on whether dlogits is asked";
      expect_same_bits(ld2, logits, "logits without dlogits");
    }
}

// ---- Optimizer ------------------------------------------------------------------------------

TEST(DenseKernels, AdamWIsTheCpuOptimizersBits) {
  PARM_SKIP_WITHOUT_GPU();
  train::OptimConfig c;
  for (bool decay : {true, false}) {
    SCOPED_TRACE(decay ? "decayed" : "not decayed");
    const int64_t n = 1007;
    model::Param p;
    p.value = host_normal({n}, 150);
    p.grad = Tensor({n});
    p.weight_decay = decay;
    Tensor w = gpu(p.value), m = gpu(Tensor({n})), v = gpu(Tensor({n}));
    train::AdamW opt({&p});
    for (int64_t step = 1; step <= 3; ++step) {
      p.grad = host_normal({n}, 160 + static_cast<uint64_t>(step), 0.3f);
      const Tensor g = gpu(p.grad);
      const double lr = 2e-3 / static_cast<double>(step), grad_scale = 0.8;
      opt.step(c, lr, grad_scale);
      adamw_step(w.data(), g.data(), m.data(), v.data(), n, lr, c.beta1, c.beta2, c.eps,
                 c.weight_decay, step, grad_scale, decay);
      expect_same_bits(w, p.value, "params at step " + std::to_string(step));
      const train::Moments mv = opt.gather_moments();
      expect_same_bits(m, mv.m[0], "m at step " + std::to_string(step));
      expect_same_bits(v, mv.v[0], "v at step " + std::to_string(step));
    }
  }
}

TEST(DenseKernels, SumOfSquaresMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{100003}}) {
    const Tensor x = host_normal({n}, 170, 2.0f);
    double want = 2.0;  // accumulated onto
    for (int64_t i = 0; i < n; ++i) want += static_cast<double>(x[i]) * x[i];
    const Tensor xd = gpu(x);
    const DeviceArray<double> out(std::vector<double>{2.0}), again(std::vector<double>{2.0});
    sum_squares(xd.data(), n, out.data());
    sum_squares(xd.data(), n, again.data());
    EXPECT_NEAR(out.get()[0], want, 1e-12 * want) << "n " << n;
    EXPECT_EQ(out.get()[0], again.get()[0]) << "n " << n << ": not deterministic";
  }
}

TEST(DenseKernels, BadShapesAreRefusedBeforeAnyWork) {
  PARM_SKIP_WITHOUT_GPU();
  try {
    layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, 1e-5f);
    ADD_FAILURE() << "cols = 0 was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda::layernorm_forward: (rows, cols) = (4, 0); valid: rows >= 0, cols > 0"),
              std::string::npos)
        << msg;
  }
  EXPECT_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 4, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0,
                          1.0, true),
               Error);  // steps count from 1
  EXPECT_THROW(cross_entropy(nullptr, nullptr, nullptr, 2, 0, 1.0f, nullptr), Error);
  AttentionShape s;
  s.batch = 1;
  s.seq_len = 4;
  s.heads = 1;
  s.head_dim = 0;
  EXPECT_THROW(parm::cuda::attention_forward(s, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace parm::cuda
