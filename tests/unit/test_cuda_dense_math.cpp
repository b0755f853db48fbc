// The maths of the dense CUDA kernels (kernels/cuda/dense_math.h), compiled for the CPU and
// run the way the kernels run it (the lanes of a 16-thread row group, the per-head strided
// batches, the rows of the masked softmax, the threads and tree of the cross-entropy), checked
// against the CPU functions it must reproduce.
//
// The kernels compute the CPU source's expressions in its order, each operation rounded on its
// own (dense_math.h, mul_nc). The CPU kernels run as GCC target clones whose AVX2 and
// AVX-512 versions contract a * b + c into FMAs, so the two may differ by a few ulp of the
// terms: where only additions are involved (LayerNorm's mean, which shows the lane order) the
// bits must be equal; elsewhere the tolerance is a few ulp of the size of the terms (kUlps),
// while a wrong order of lanes, a wrong mask or a wrong offset is off by far more. AdamW's
// CPU loop is not cloned (no FMA): its bits must be equal. The attention's plan uses cpu::gemm
// for its products, as the CPU model does, so only its softmax rows differ.
//
// The cross-entropy takes fp32 exponentials where the CPU takes fp64 ones
// and merges per-thread running sums in a tree: each term is off by about 2^-24 relative, so
// log Z by about 1e-7 (absolute) per row; the test allows 1e-6 (1 + |loss|) on the loss and
// 1e-6 of the largest |dlogit| on each dlogit, while a wrong max, a lost term or a wrong
// target is off by O(1e-3) or more.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/dense_math.h"
#include "kernels/cuda/expert_math.h"
#include "model/blocks.h"
#include "model/param.h"
#include "parm/rng.h"
#include "train/optimizer.h"

namespace parm::cuda::dense_math {
namespace {

constexpr uint64_t kSeed = 20261201;

std::vector<float> normals(int64_t n, uint64_t stream, float stddev = 1.0f, float mean = 0.0f) {
  Rng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = mean + stddev * rng.normal();
  return v;
}

// |got - want| <= ulps * 2^-24 * size, size >= |want| the size of the terms that made want.
constexpr double kUlps = 8.0;
::testing::AssertionResult close(float got, float want, double size, double ulps = kUlps) {
  const double tol = ulps * 0x1p-24 * std::fmax(size, std::fabs(static_cast<double>(want))) + 1e-44;
  if (std::fabs(static_cast<double>(got) - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " vs " << want << " (tolerance " << tol << ")";
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// The sum a 16-thread row group computes: each lane's partial, then finish_lanes (what
// dense_rows.cuh group_sum does after its shuffles).
template <class F>
float group_sum_host(int64_t n, F f) {
  float lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = lane_partial(n, j, f);
  return finish_lanes(lanes, n, f);
}

// dense_rows.cuh softmax_row on the host.
void softmax_row_host(const float* x, float* y, int64_t n, int64_t zero_to, float scale) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < n; ++c) {
    const float v = mul_nc(x[c], scale);
    mx = v > mx ? v : mx;
  }
  std::vector<float> e(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) e[c] = exp_f32(mul_nc(x[c], scale) - mx);
  const float inv = 1.0f / group_sum_host(n, [&](int64_t c) { return e[c]; });
  for (int64_t c = 0; c < n; ++c) y[c] = mul_nc(e[c], inv);
  for (int64_t c = n; c < zero_to; ++c) y[c] = 0.0f;
}

// dense_rows.cuh softmax_backward_row on the host (dx may alias dy).
void softmax_backward_row_host(const float* y, const float* dy, float* dx, int64_t n,
                               int64_t zero_to, float scale) {
  const float dot = group_sum_host(n, [&](int64_t c) { return mul_nc(y[c], dy[c]); });
  for (int64_t c = 0; c < n; ++c) dx[c] = mul_nc(mul_nc(y[c], dy[c] - dot), scale);
  for (int64_t c = n; c < zero_to; ++c) dx[c] = 0.0f;
}

const int64_t kRowLengths[] = {1, 7, 15, 16, 17, 31, 33, 100, 768, 1000};

TEST(CudaDenseMath, LayerNormForwardIsTheCpuKernelsBits) {
  for (int64_t cols : kRowLengths) {
    const int64_t rows = 3;
    const std::vector<float> x = normals(rows * cols, 1, 2.0f, 0.5f);
    const std::vector<float> gamma = normals(cols, 2, 0.3f, 1.0f);
    const std::vector<float> beta = normals(cols, 3, 0.1f);
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                           rows, cols, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      const float mu =
          mul_nc(group_sum_host(cols, [&](int64_t c) { return xr[c]; }), inv_count(cols));
      const float rs = rstd_of(group_sum_host(cols, [&](int64_t c) { return centred_square(xr[c], mu); }),
                               cols, 1e-5f);
      ASSERT_EQ(bits(mu), bits(mean[r])) << "cols " << cols << " row " << r;
      ASSERT_TRUE(close(rs, rstd[r], 0.0)) << "cols " << cols << " row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        const double size = std::fabs((xr[c] - mu) * rs * gamma[c]) + std::fabs(beta[c]);
        ASSERT_TRUE(close(layernorm_y(xr[c], mu, rs, gamma[c], beta[c]), y[r * cols + c], size))
            << "cols " << cols << " row " << r << " col " << c;
      }
    }
  }
}

TEST(CudaDenseMath, LayerNormBackwardDxIsTheCpuKernelsBits) {
  for (int64_t cols : kRowLengths) {
    const int64_t rows = 3;
    const std::vector<float> x = normals(rows * cols, 4, 1.5f, -0.2f);
    const std::vector<float> dy = normals(rows * cols, 5);
    const std::vector<float> gamma = normals(cols, 6, 0.3f, 1.0f);
    const std::vector<float> beta(static_cast<size_t>(cols), 0.0f);
    std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size());
    std::vector<float> dgamma(static_cast<size_t>(cols)), dbeta(static_cast<size_t>(cols));
    cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                           rows, cols, 1e-5f);
    cpu::layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                            dgamma.data(), dbeta.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      const float* dyr = dy.data() + r * cols;
      const float mu = mean[r], rs = rstd[r];
      const float mean_g =
          mul_nc(group_sum_host(cols, [&](int64_t c) { return mul_nc(dyr[c], gamma[c]); }),
                 inv_count(cols));
      const float mean_gx = mul_nc(group_sum_host(cols,
                                                  [&](int64_t c) {
                                                    return mul_nc(mul_nc(dyr[c], gamma[c]),
                                                                  xhat(xr[c], mu, rs));
                                                  }),
                                   inv_count(cols));
      for (int64_t c = 0; c < cols; ++c) {
        const float xh = xhat(xr[c], mu, rs);
        const double size = rs * (std::fabs(dyr[c] * gamma[c]) + std::fabs(mean_g) +
                                  std::fabs(xh * mean_gx));
        ASSERT_TRUE(close(layernorm_dx(dyr[c], gamma[c], xh, rs, mean_g, mean_gx), dx[r * cols + c],
                          size))
            << "cols " << cols << " row " << r << " col " << c;
      }
    }
  }
}

TEST(CudaDenseMath, ExpIsTheCpuKernelsExp) {
  // softmax of a one-element row is exp(0) / exp(0); of [a, 0] it exposes exp(-a) through
  // 1 / (1 + exp(-a)): compare exp_f32 with the CPU's exp inside its softmax at many points.
  for (int i = -1200; i <= 1200; ++i) {
    const float a = 0.0937f * static_cast<float>(i);
    const float x[2] = {a, 0.0f};
    float y[2];
    cpu::softmax_forward(x, y, 1, 2);
    const float mx = a > 0.0f ? a : 0.0f;
    const float e0 = exp_f32(a - mx), e1 = exp_f32(0.0f - mx);
    const float inv = 1.0f / (e0 + e1);
    ASSERT_TRUE(close(mul_nc(e0, inv), y[0], 0.0, 4.0)) << "a = " << a;
    ASSERT_TRUE(close(mul_nc(e1, inv), y[1], 0.0, 4.0)) << "a = " << a;
  }
  // Against exp in fp64: within 2 ulp where the result is normal; the specials as exp.
  for (int i = -8700; i <= 8800; ++i) {
    const float x = 0.01f * static_cast<float>(i);
    const double want = std::exp(static_cast<double>(x));
    if (want < 1.2e-38) continue;
    EXPECT_NEAR(exp_f32(x), want, 2.5 * 0x1p-23 * want) << "x = " << x;
  }
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(exp_f32(100.0f), INFINITY);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_f32(-std::numeric_limits<float>::quiet_NaN())));
}

TEST(CudaDenseMath, SoftmaxRowsAreTheCpuKernelsBits) {
  for (int64_t cols : kRowLengths) {
    const int64_t rows = 3;
    const std::vector<float> x = normals(rows * cols, 7, 3.0f);
    const std::vector<float> dy = normals(rows * cols, 8);
    std::vector<float> y(x.size()), dx(x.size()), gy(x.size()), gdx(x.size());
    cpu::softmax_forward(x.data(), y.data(), rows, cols);
    cpu::softmax_backward(y.data(), dy.data(), dx.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      softmax_row_host(x.data() + r * cols, gy.data() + r * cols, cols, cols, 1.0f);
      softmax_backward_row_host(y.data() + r * cols, dy.data() + r * cols, gdx.data() + r * cols,
                                cols, cols, 1.0f);
    }
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0.0;
      for (int64_t c = 0; c < cols; ++c) dot += std::fabs(y[r * cols + c] * dy[r * cols + c]);
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        ASSERT_TRUE(close(gy[i], y[i], 0.0)) << "cols " << cols << " element " << i;
        ASSERT_TRUE(close(gdx[i], dx[i], y[i] * (std::fabs(dy[i]) + dot)))
            << "cols " << cols << " element " << i;
      }
    }
  }
}

// The row-major product with leading dimensions, as the cuBLAS call made from
// column_major_gemm_ld would compute it (cuBLAS's column-major definition, reading exactly
// those arguments), against cpu::gemm. Quarter integers: every sum is exact.
TEST(CudaDenseMath, StridedGemmMappingMatchesCpuGemm) {
  Rng rng(kSeed, 9);
  auto quarters = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng.next_u32() % 9) - 4) * 0.25f;
    return v;
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 5, n = 7, k = 3, lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 3,
                    ldc = n + 1;
      const std::vector<float> a = quarters((ta ? k : m) * lda);
      const std::vector<float> b = quarters((tb ? n : k) * ldb);
      std::vector<float> want(static_cast<size_t>(m * ldc), -9.0f), got = want;
      cpu::gemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, want.data(), ldc, false);
      const ColumnMajorGemm g = column_major_gemm_ld(ta, tb, m, n, k, lda, ldb, ldc);
      // C_cm (g.m, g.n) = op(first) op(second); first = b, second = a.
      for (int64_t j = 0; j < g.n; ++j)
        for (int64_t i = 0; i < g.m; ++i) {
          double s = 0.0;
          for (int64_t l = 0; l < g.k; ++l) {
            const float f = g.trans_first ? b.at(static_cast<size_t>(l + i * g.ld_first))
                                          : b.at(static_cast<size_t>(i + l * g.ld_first));
            const float sd = g.trans_second ? a.at(static_cast<size_t>(j + l * g.ld_second))
                                            : a.at(static_cast<size_t>(l + j * g.ld_second));
            s += static_cast<double>(f) * sd;
          }
          got.at(static_cast<size_t>(i + j * g.ldc)) = static_cast<float>(s);
        }
      EXPECT_EQ(got, want) << "trans_a " << ta << " trans_b " << tb;
    }
}

// The GPU attention's plan, run on the CPU: per head one strided batch over the sequences
// (HeadBatch offsets and strides, cpu::gemm per batch entry as cuBLAS would run it), the
// masked softmax over every row of probs with the query index r mod L, and the backward pass
// with one head's (B, L, L) scores. Must equal model::attention_* up to the softmax rows'
// rounding (kUlps of the largest value of each tensor); masked probabilities exactly 0.
void attention_plan(const AttentionShape& s, const float* q, const float* k, const float* v,
                    float* probs, float* out) {
  const int64_t B = s.batch, L = s.seq_len, H = s.heads, D = s.head_dim;
  const HeadBatch hb = head_batch(L, H, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t b = 0; b < B; ++b)
      cpu::gemm(false, true, L, L, D, q + b * hb.head_stride + hb.head_offset(h, D), hb.ld,
                k + b * hb.head_stride + hb.head_offset(h, D), hb.ld,
                probs + b * hb.probs_stride + hb.probs_offset(h, L), L, false);
  for (int64_t r = 0; r < B * H * L; ++r)
    softmax_row_host(probs + r * L, probs + r * L, keys_seen(r % L, L, s.causal), L, scale);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t b = 0; b < B; ++b)
      cpu::gemm(false, false, L, D, L, probs + b * hb.probs_stride + hb.probs_offset(h, L), L,
                v + b * hb.head_stride + hb.head_offset(h, D), hb.ld,
                out + b * hb.head_stride + hb.head_offset(h, D), hb.ld, false);
}

void attention_backward_plan(const AttentionShape& s, const float* q, const float* k,
                             const float* v, const float* probs, const float* dout, float* dq,
                             float* dk, float* dv) {
  const int64_t B = s.batch, L = s.seq_len, H = s.heads, D = s.head_dim;
  const HeadBatch hb = head_batch(L, H, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> ds(static_cast<size_t>(B * L * L));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t off = hb.head_offset(h, D), poff = hb.probs_offset(h, L);
    for (int64_t b = 0; b < B; ++b) {
      cpu::gemm(true, false, L, D, L, probs + b * hb.probs_stride + poff, L,
                dout + b * hb.head_stride + off, hb.ld, dv + b * hb.head_stride + off, hb.ld,
                false);
      cpu::gemm(false, true, L, L, D, dout + b * hb.head_stride + off, hb.ld,
                v + b * hb.head_stride + off, hb.ld, ds.data() + b * L * L, L, false);
    }
    for (int64_t r = 0; r < B * L; ++r) {
      const int64_t b = r / L, i = r % L;
      softmax_backward_row_host(probs + b * hb.probs_stride + poff + i * L, ds.data() + r * L,
                                ds.data() + r * L, keys_seen(i, L, s.causal), L, scale);
    }
    for (int64_t b = 0; b < B; ++b) {
      cpu::gemm(false, false, L, D, L, ds.data() + b * L * L, L, k + b * hb.head_stride + off,
                hb.ld, dq + b * hb.head_stride + off, hb.ld, false);
      cpu::gemm(true, false, L, D, L, ds.data() + b * L * L, L, q + b * hb.head_stride + off,
                hb.ld, dk + b * hb.head_stride + off, hb.ld, false);
    }
  }
}

void expect_all_close(const std::vector<float>& got, const std::vector<float>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double size = 0.0;
  for (float w : want) size = std::fmax(size, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(close(got[i], want[i], size)) << what << " element " << i;
}

TEST(CudaDenseMath, AttentionPlanIsTheCpuAttention) {
  for (bool causal : {true, false}) {
    AttentionShape s;
    s.batch = 2;
    s.seq_len = 37;  // not a multiple of 16 or 32
    s.heads = 3;
    s.head_dim = 5;
    s.causal = causal;
    const int64_t act = s.batch * s.seq_len * s.width();
    const int64_t np = s.batch * s.heads * s.seq_len * s.seq_len;
    const std::vector<float> q = normals(act, 10), k = normals(act, 11), v = normals(act, 12),
                             dout = normals(act, 13);
    std::vector<float> probs(np, 7.0f), out(act, 7.0f), gprobs(np, -7.0f), gout(act, -7.0f);
    model::attention_forward(s, q.data(), k.data(), v.data(), probs.data(), out.data());
    attention_plan(s, q.data(), k.data(), v.data(), gprobs.data(), gout.data());
    expect_all_close(gprobs, probs, "probs");
    expect_all_close(gout, out, "out");
    for (int64_t r = 0; causal && r < s.batch * s.heads * s.seq_len; ++r)
      for (int64_t j = r % s.seq_len + 1; j < s.seq_len; ++j)
        ASSERT_EQ(gprobs[r * s.seq_len + j], 0.0f) << "masked entry (" << r << ", " << j << ")";
    std::vector<float> dq(act, 7.0f), dk(act, 7.0f), dv(act, 7.0f), dscores(s.seq_len * s.seq_len);
    std::vector<float> gdq(act, -7.0f), gdk(act, -7.0f), gdv(act, -7.0f);
    model::attention_backward(s, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                              dk.data(), dv.data(), dscores.data());
    attention_backward_plan(s, q.data(), k.data(), v.data(), probs.data(), dout.data(), gdq.data(),
                            gdk.data(), gdv.data());
    expect_all_close(gdq, dq, "dq");
    expect_all_close(gdk, dk, "dk");
    expect_all_close(gdv, dv, "dv");
  }
}

TEST(CudaDenseMath, CausalMaskSeesTheDiagonalAndBefore) {
  EXPECT_EQ(keys_seen(0, 5, true), 1);
  EXPECT_EQ(keys_seen(4, 5, true), 5);
  EXPECT_EQ(keys_seen(0, 5, false), 5);
  const HeadBatch hb = head_batch(7, 3, 4);
  EXPECT_EQ(hb.ld, 12);
  EXPECT_EQ(hb.head_stride, 84);
  EXPECT_EQ(hb.probs_stride, 147);
  EXPECT_EQ(hb.head_offset(2, 4), 8);
  EXPECT_EQ(hb.probs_offset(2, 7), 98);
}

// One row as a block of `threads` threads folds it (thread t takes elements t, t + threads,
// ...), then the fixed tree of dense_loss.cu (threads a power of two).
LogSumExp row_lse(const float* x, int64_t vocab, int threads) {
  std::vector<LogSumExp> part(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    for (int64_t c = t; c < vocab; c += threads) lse_add(part[t], x[c]);
  for (int s = threads / 2; s > 0; s /= 2)
    for (int t = 0; t < s; ++t) part[t] = lse_merge(part[t], part[t + s]);
  return part[0];
}

TEST(CudaDenseMath, CrossEntropyLogSumExpMatchesCpu) {
  for (int64_t vocab : {1, 2, 255, 256, 257, 1000, 50257}) {
    for (float offset : {0.0f, 1000.0f, -1000.0f}) {
      const int64_t n = 3;
      std::vector<float> logits = normals(n * vocab, 14, 4.0f, offset);
      if (vocab > 10) {
        logits[5] = offset + 60.0f;  // one dominant logit
        logits[2] = -INFINITY;  // masked logits (not targets), first in their threads' share
        logits[vocab + 3] = -INFINITY;
      }
      std::vector<int32_t> targets(n);
      for (int64_t r = 0; r < n; ++r) targets[r] = static_cast<int32_t>((r * 7919) % vocab);
      std::vector<float> dl(logits.size());
      const float scale = 0.125f;
      const double want = model::cross_entropy(logits.data(), targets.data(), dl.data(), n, vocab,
                                               scale);
      double got = 0.0;
      float max_dl = 0.0f;
      for (float d : dl) max_dl = std::fmax(max_dl, std::fabs(d));
      for (int threads : {1, 32, 256}) {
        got = 0.0;
        for (int64_t r = 0; r < n; ++r) {
          const float* x = logits.data() + r * vocab;
          const double log_z = lse_value(row_lse(x, vocab, threads));
          got += log_z - static_cast<double>(x[targets[r]]);
          for (int64_t c = 0; c < vocab; ++c)
            ASSERT_NEAR(ce_grad(x[c], log_z, scale, c == targets[r]), dl[r * vocab + c],
                        1e-6 * max_dl)
                << "vocab " << vocab << " offset " << offset << " threads " << threads;
        }
        EXPECT_NEAR(got, want, 1e-6 * (1.0 + std::fabs(want)))
            << "vocab " << vocab << " offset " << offset << " threads " << threads;
      }
    }
  }
}

TEST(CudaDenseMath, AdamWIsTheCpuOptimizersBits) {
  train::OptimConfig c;
  c.weight_decay = 0.1;
  model::Param p_decay, p_plain;
  p_decay.value = Tensor({37});
  p_decay.grad = Tensor({37});
  p_plain.value = Tensor({19});
  p_plain.grad = Tensor({19});
  p_plain.weight_decay = false;  // biases and gains
  fill_normal(p_decay.value, kSeed, 15, 0.0f, 1.0f);
  fill_normal(p_plain.value, kSeed, 16, 0.0f, 1.0f);
  std::vector<float> w_decay(p_decay.value.data(), p_decay.value.data() + 37);
  std::vector<float> w_plain(p_plain.value.data(), p_plain.value.data() + 19);
  std::vector<float> m_decay(37), v_decay(37), m_plain(19), v_plain(19);
  train::AdamW opt({&p_decay, &p_plain});
  for (int64_t step = 1; step <= 5; ++step) {
    fill_normal(p_decay.grad, kSeed, 100 + step, 0.0f, 0.5f);
    fill_normal(p_plain.grad, kSeed, 200 + step, 0.0f, 0.5f);
    const double lr = 1e-3 * static_cast<double>(step), grad_scale = 0.75;
    opt.step(c, lr, grad_scale);
    const AdamWScalars sd =
        adamw_scalars(lr, c.beta1, c.beta2, c.eps, c.weight_decay, step, grad_scale, true);
    const AdamWScalars sp =
        adamw_scalars(lr, c.beta1, c.beta2, c.eps, c.weight_decay, step, grad_scale, false);
    for (int i = 0; i < 37; ++i) adamw_update(w_decay[i], p_decay.grad.data()[i], m_decay[i], v_decay[i], sd);
    for (int i = 0; i < 19; ++i) adamw_update(w_plain[i], p_plain.grad.data()[i], m_plain[i], v_plain[i], sp);
    const train::Moments mv = opt.gather_moments();
    for (int i = 0; i < 37; ++i) {
      ASSERT_EQ(bits(w_decay[i]), bits(p_decay.value.data()[i])) << "step " << step << " i " << i;
      ASSERT_EQ(bits(m_decay[i]), bits(mv.m[0].data()[i]));
      ASSERT_EQ(bits(v_decay[i]), bits(mv.v[0].data()[i]));
    }
    for (int i = 0; i < 19; ++i)
      ASSERT_EQ(bits(w_plain[i]), bits(p_plain.value.data()[i])) << "step " << step << " i " << i;
  }
}

TEST(CudaDenseMath, Bf16RoundingIsTheCpuProductsRounding) {
  std::vector<float> x = normals(20000, 17, 3.0f);
  for (float v : {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, 3.3895314e38f, 3.40282347e38f,
                  1e-40f, -1e-40f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff800001u})
    x.push_back(bits_to_float(u));
  // The CPU products' rounding: x as a (1, n) A packed by the portable (scalar) packing.
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> packed(static_cast<size_t>(cpu::bf16_packed_a_size(1, n)));
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kPortable);
  cpu::bf16_pack_a(false, 1, n, x.data(), n, packed.data());
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  const int64_t kp = cpu::detail::round_up(n, cpu::detail::kTileK);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[static_cast<size_t>(i)];
    const uint16_t h = expert_math::f32_to_bf16(v);
    const uint16_t cpu_h = packed[static_cast<size_t>(cpu::detail::packed_a_offset(0, i, kp))];
    ASSERT_EQ(h, cpu_h) << "x bits " << std::hex << bits(v);
    ASSERT_EQ(bits(expert_math::bf16_to_f32(h)), static_cast<uint32_t>(cpu_h) << 16);
  }
}

}  // namespace
}  // namespace parm::cuda::dense_math
