// The per-row maths of the CUDA MoE kernels (src/kernels/math/moe_math.h), run on the CPU by
// serial loops shaped like the kernels' grids (one "thread" per row, the slot scan's chunks
// and per-thread items, 16 lanes per dot product), against the CPU layer functions of
// moe/moe_ops.h on the same inputs. Needs no GPU and no CUDA.
//
// Bit-identical (checked exactly): top-k (ties, NaN, inf), combine weights, GShard rows,
// fill and the inverse map, 1st-choice counts, the weights backward of the gate, dispatch
// forward/backward, combine forward, combine backward (dbuf and dweight).
// Bit-identical only where the CPU softmax runs one of its FMA clones (x86-64-v3 or newer,
// which moe_math.h reproduces): softmax forward; elsewhere within 8 ulp.
// Not bit-identical: softmax backward (how the CPU clone rounds the tail of its dot product,
// fused or not, depends on how GCC vectorised it: within the bound of expect_dsoftmax); the
// probability sums of the l_aux statistics (the kernel sums a column in a fixed block tree,
// the CPU in token order): within (T + 16) u psum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/math/moe_math.h"
#include "moe/moe_ops.h"
#include "parm/rng.h"
#include "parm/tensor.h"

namespace parm::math {
namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
constexpr uint64_t kSeed = 20250611;
constexpr int64_t kModelDim = 24;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// True when cpu::softmax_forward / softmax_backward run an FMA clone here (vec_math.h's
// PARM_SIMD_CLONES picks x86-64-v3 or v4 on such a CPU).
bool cpu_softmax_fused() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v3");
#else
  return false;
#endif
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Distance in representable floats (same-sign finite values; enough here).
int64_t ulps(float a, float b) {
  auto key = [](float x) {
    const auto v = static_cast<int64_t>(bits(x));
    return v & 0x80000000 ? -(v & 0x7fffffff) : v;
  };
  return std::llabs(key(a) - key(b));
}

// Every element the same bits; reports the count and the first difference.
void expect_bits(const float* got, const float* want, int64_t n, const std::string& what) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i)
    if (bits(got[i]) != bits(want[i]) && ++bad == 1) first = i;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " differ, first at " << first
                    << ": " << (first >= 0 ? got[first] : 0.0f) << " vs "
                    << (first >= 0 ? want[first] : 0.0f);
}

// Bits when the CPU's own rounding is the one moe_math.h reproduces, else within 8 ulp.
void expect_softmax_bits(const float* got, const float* want, int64_t n,
                         const std::string& what) {
  if (cpu_softmax_fused()) {
    expect_bits(got, want, n, what);
    return;
  }
  int64_t worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, ulps(got[i], want[i]));
  EXPECT_LE(worst, 8) << what;
}

// Softmax backward dx = y * (dy - <y, dy>) of two computations that may round the dot
// product differently: each dot within 2 (cols + 2) u sum |y dy|, so
// |dx - dx'| <= |y| * 4 (cols + 2) u sum |y dy| + 4 u |dx|.
void expect_dsoftmax(const float* y, const float* dy, const float* got, const float* want,
                     int64_t rows, int64_t cols, const std::string& what) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double mag = 0.0;
    for (int64_t c = 0; c < cols; ++c) mag += std::fabs(double{y[r * cols + c]} * dy[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double tol = std::fabs(y[i]) * 4.0 * static_cast<double>(cols + 2) * kU * mag +
                         4.0 * kU * std::fabs(want[i]);
      if (std::fabs(double{got[i]} - want[i]) > tol && ++bad <= 3)
        ADD_FAILURE() << what << ": element " << i << ": " << got[i] << " vs " << want[i]
                      << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> normal(int64_t n, uint64_t stream, float stddev = 1.0f) {
  Rng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = stddev * rng.normal();
  return v;
}

Tensor tensor_of(const std::vector<float>& v, Shape shape) {
  Tensor t(std::move(shape));
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

// ---- the kernels' grids, run serially ----

// slots_stats_kernel: one "block" per expert scanning the priority order in chunks; the
// exclusive scan of the per-thread counts done serially (integers: any order is exact).
struct Slots {
  std::vector<int32_t> row, source, fill;
  std::vector<float> count;
};
Slots emulate_slots(const std::vector<int32_t>& expert, int64_t T, int64_t E, int k,
                    int64_t capacity, int64_t slots) {
  Slots s;
  s.row.assign(static_cast<size_t>(T * k), -7);
  s.source.assign(static_cast<size_t>(E * T), -7);
  s.fill.assign(static_cast<size_t>(E), -7);
  s.count.assign(static_cast<size_t>(E), -7.0f);
  const int64_t n = T * k;
  std::vector<unsigned char> flag(kSlotChunk);
  for (int64_t e = 0; e < E; ++e) {
    int64_t taken = 0;
    int first = 0;
    for (int64_t base = 0; base < n; base += kSlotChunk) {
      for (int local = 0; local < kSlotChunk; ++local) {
        const int64_t i = base + local;
        flag[local] = i < n && expert[static_cast<size_t>(priority_choice(i, T, k))] == e;
      }
      int64_t before = 0;  // exclusive scan over the threads
      for (int th = 0; th < kSlotThreads; ++th) {
        const int mine = th * kSlotItems;
        int64_t count = 0;
        for (int u = 0; u < kSlotItems; ++u) count += flag[mine + u];
        const int64_t end = assign_slots(&flag[mine], kSlotItems, base + mine, T, k, e,
                                         taken + before, capacity, slots, s.row.data(),
                                         s.source.data(), &first);
        EXPECT_EQ(end, taken + before + count);
        before += count;
      }
      taken += before;
    }
    s.fill[static_cast<size_t>(e)] = static_cast<int32_t>(std::min(taken, capacity));
    s.count[static_cast<size_t>(e)] = static_cast<float>(first);
  }
  return s;
}

// The kernel's column sum: 512 strided thread partials, a shuffle-down tree per warp, then
// the same tree over the 16 warp sums.
float emulate_column_sum(const float* probs, int64_t T, int64_t E, int64_t e) {
  auto warp_tree = [](float* v) {
    for (int o = 16; o > 0; o >>= 1) {
      float next[32];
      for (int lane = 0; lane < 32; ++lane)  // __shfl_down_sync: past lane 31, the own value
        next[lane] = v[lane] + v[lane + o < 32 ? lane + o : lane];
      std::copy(next, next + 32, v);
    }
    return v[0];
  };
  std::vector<float> partial(kSlotThreads, 0.0f);
  for (int th = 0; th < kSlotThreads; ++th)
    for (int64_t t = th; t < T; t += kSlotThreads) partial[th] += probs[t * E + e];
  float warp_sums[32] = {};
  for (int w = 0; w < kSlotThreads / 32; ++w) warp_sums[w] = warp_tree(&partial[w * 32]);
  return warp_tree(warp_sums);
}

// gather_slots_kernel: every buffer row from the inverse map; scale null: a copy.
std::vector<float> emulate_gather(const float* x, const Slots& s, const float* scale, int64_t T,
                                  int64_t E, int k, int64_t slots) {
  const int64_t M = kModelDim;
  std::vector<float> buf(static_cast<size_t>(E * slots * M), kNaN);
  for (int64_t r = 0; r < E * slots; ++r) {
    const int64_t e = r / slots, slot = r % slots;
    float* dst = &buf[static_cast<size_t>(r * M)];
    if (slot >= s.fill[static_cast<size_t>(e)]) {
      for (int64_t m = 0; m < M; ++m) dst[m] = 0.0f;
      continue;
    }
    const int64_t c = s.source[static_cast<size_t>(e * T + slot)];
    const float* src = x + (c / k) * M;
    for (int64_t m = 0; m < M; ++m) dst[m] = scale == nullptr ? src[m] : mul_nc(scale[c], src[m]);
  }
  return buf;
}

// ---- the cases ----

enum class Logits { kRandom, kTiedPairs, kUniform };

struct GateCase {
  int64_t T, E;
  int k;
  int64_t capacity, slots;
  Logits logits;
  std::string name() const {
    return "T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
           " C=" + std::to_string(capacity) + " slots=" + std::to_string(slots) +
           " logits=" + std::to_string(static_cast<int>(logits));
  }
};

std::vector<GateCase> gate_cases() {
  std::vector<GateCase> cases;
  int variant = 0;
  for (int64_t T : {1, 7, 300, 4500})
    for (int64_t E : {1, 3, 8, 20}) {
      std::vector<int> ks = {1};  // 1, 2 and E, each once
      if (E >= 2) ks.push_back(2);
      if (E > 2) ks.push_back(static_cast<int>(E));
      for (int k : ks) {
        const int64_t demand = (k * T + E - 1) / E;  // C at capacity factor 1
        for (int64_t capacity : {int64_t{0}, (demand + 2) / 3, demand, T}) {
          const auto logits = static_cast<Logits>(variant % 3);
          const int64_t slots = capacity + (variant % 2) * 3;
          cases.push_back({T, E, k, capacity, slots, logits});
          ++variant;
        }
      }
    }
  return cases;
}

// x (T, M), wg (M, E): random, or wg with tied column pairs (column e = column e & ~1), or
// zero (every probability 1/E: every token picks experts 0..k-1, the most drops).
void make_gate_inputs(const GateCase& c, Tensor& x, Tensor& wg) {
  const int64_t M = kModelDim;
  x = tensor_of(normal(c.T * M, 1), {c.T, M});
  wg = tensor_of(normal(M * c.E, 2, 0.5f), {M, c.E});
  if (c.logits == Logits::kTiedPairs)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t e = 1; e < c.E; e += 2) wg.at(m, e) = wg.at(m, e - 1);
  if (c.logits == Logits::kUniform) wg.zero();
}

// ---- tests ----

TEST(CudaMoeMath, ExpMatchesLibmWithinTwoUlp) {
  int64_t worst = 0;
  for (float x = -110.0f; x < 95.0f; x += 0.00731f) {
    const float got = exp_f32(x);
    const auto want = static_cast<float>(std::exp(static_cast<double>(x)));
    if (want == 0.0f || std::isinf(want)) {
      EXPECT_EQ(got, want) << x;
      continue;
    }
    if (std::fpclassify(want) == FP_SUBNORMAL) continue;  // denormal precision only
    worst = std::max(worst, ulps(got, want));
  }
  EXPECT_LE(worst, 2);
  EXPECT_EQ(exp_f32(-kInf), 0.0f);
  EXPECT_EQ(exp_f32(kInf), kInf);
  EXPECT_TRUE(std::isnan(exp_f32(kNaN)));
  EXPECT_TRUE(std::isnan(exp_f32(-kNaN)));
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
}

TEST(CudaMoeMath, TopkRowMatchesCpuWithTiesNanAndInf) {
  const std::vector<std::vector<float>> rows = {
      {0.5f, 0.5f, 0.25f, 0.5f},
      {1.0f, kNaN, 2.0f, kNaN, -kInf},
      {kInf, 3.0f, kInf, -kInf, 0.0f, -0.0f},
      {-0.0f, 0.0f, -0.0f},
      {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 0.0f, 0.9f, 0.8f},
      {7.0f},
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const auto cols = static_cast<int64_t>(row.size());
    for (int k = 1; k <= cols; ++k) {
      std::vector<int32_t> idx(k), want_idx(k);
      std::vector<float> val(k), want_val(k);
      topk_row(row.data(), cols, k, idx.data(), val.data());
      cpu::topk(row.data(), 1, cols, k, want_idx.data(), want_val.data());
      EXPECT_EQ(idx, want_idx) << "row " << r << " k " << k;
      expect_bits(val.data(), want_val.data(), k, "values of row " + std::to_string(r));
    }
  }
  // Random rows with many exact ties, k up to 40 (the CPU sorts above k = 32).
  Rng rng(kSeed, 3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t cols = 1 + trial % 16 + (trial % 5 == 0 ? 24 : 0);
    std::vector<float> row(static_cast<size_t>(cols));
    for (float& v : row) v = static_cast<float>(rng.next_u32() % 4) * 0.25f;
    for (int k = 1; k <= cols; ++k) {
      std::vector<int32_t> idx(k), want_idx(k);
      std::vector<float> val(k), want_val(k);
      topk_row(row.data(), cols, k, idx.data(), val.data());
      cpu::topk(row.data(), 1, cols, k, want_idx.data(), want_val.data());
      ASSERT_EQ(idx, want_idx) << "trial " << trial << " k " << k;
    }
  }
}

TEST(CudaMoeMath, SoftmaxRowsMatchCpu) {
  const bool fused = cpu_softmax_fused();
  std::printf("[ info ] CPU softmax FMA clone: %s (%s)\n", fused ? "yes" : "no",
              fused ? "bit-identical required" : "8 ulp allowed");
  for (int64_t cols : {1, 2, 3, 8, 15, 16, 17, 20, 33, 64, 100}) {
    const int64_t rows = 64;
    std::vector<float> x = normal(rows * cols, 10 + cols, 3.0f);
    x[0] = -kInf;  // a -inf logit: probability 0
    if (cols > 2) x[static_cast<size_t>(cols + 1)] = x[static_cast<size_t>(cols)];  // a tie
    std::vector<float> want(x.size()), got(x.size());
    cpu::softmax_forward(x.data(), want.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r)  // one thread per row
      softmax_row(&x[static_cast<size_t>(r * cols)], &got[static_cast<size_t>(r * cols)], cols);
    expect_softmax_bits(got.data(), want.data(), rows * cols,
                        "softmax forward, cols " + std::to_string(cols));
    // In place, as the backend runs it.
    std::vector<float> inplace = x;
    for (int64_t r = 0; r < rows; ++r)
      softmax_row(&inplace[static_cast<size_t>(r * cols)],
                  &inplace[static_cast<size_t>(r * cols)], cols);
    expect_bits(inplace.data(), got.data(), rows * cols, "softmax in place");

    const std::vector<float> dy = normal(rows * cols, 40 + cols);
    std::vector<float> dwant(x.size()), dgot(x.size());
    cpu::softmax_backward(want.data(), dy.data(), dwant.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      softmax_backward_row(&want[static_cast<size_t>(r * cols)],
                           &dy[static_cast<size_t>(r * cols)],
                           &dgot[static_cast<size_t>(r * cols)], cols);
    expect_dsoftmax(want.data(), dy.data(), dgot.data(), dwant.data(), rows, cols,
                    "softmax backward, cols " + std::to_string(cols));
  }
}

// The gate forward and backward and dispatch/combine of every case against moe_ops.h.
TEST(CudaMoeMath, GateDispatchCombineMatchCpu) {
  const int64_t M = kModelDim;
  const auto cases = gate_cases();
  int checked = 0, with_drops = 0, multi_chunk = 0;
  for (const GateCase& c : cases) {
    SCOPED_TRACE(c.name());
    const int64_t T = c.T, E = c.E;
    const int k = c.k;
    Tensor x, wg;
    make_gate_inputs(c, x, wg);

    // CPU oracle.
    Tensor probs({T, E});
    moe::GateRouting r;
    std::vector<float> stats(static_cast<size_t>(2 * E + 1), kNaN);
    moe::gate_forward(x, wg, k, c.capacity, c.slots, probs, r, stats.data());

    // Softmax (one thread per row) on the same logits.
    Tensor logits({T, E});
    cpu::gemm(false, false, T, E, M, x.data(), wg.data(), logits.data(), false);
    std::vector<float> my_probs(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t)
      softmax_row(logits.row(t), &my_probs[static_cast<size_t>(t * E)], E);
    expect_softmax_bits(my_probs.data(), probs.data(), T * E, "probs");

    // Top-k + weights (one thread per row) on the CPU's probabilities.
    std::vector<int32_t> expert(static_cast<size_t>(T * k));
    std::vector<float> prob(expert.size()), weight(expert.size());
    for (int64_t t = 0; t < T; ++t) {
      topk_row(probs.row(t), E, k, &expert[static_cast<size_t>(t * k)],
               &prob[static_cast<size_t>(t * k)]);
      combine_weights(&prob[static_cast<size_t>(t * k)], k, &weight[static_cast<size_t>(t * k)]);
    }
    ASSERT_EQ(expert, r.expert);
    expect_bits(prob.data(), r.prob.data(), T * k, "prob");
    expect_bits(weight.data(), r.weight.data(), T * k, "weight");

    // Slots + statistics.
    const Slots s = emulate_slots(expert, T, E, k, c.capacity, c.slots);
    ASSERT_EQ(std::vector<int64_t>(s.row.begin(), s.row.end()), r.row);
    ASSERT_EQ(std::vector<int64_t>(s.fill.begin(), s.fill.end()), r.fill);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t slot = 0; slot < s.fill[static_cast<size_t>(e)]; ++slot) {
        const int32_t ch = s.source[static_cast<size_t>(e * T + slot)];
        ASSERT_TRUE(ch >= 0 && ch < T * k) << "expert " << e << " slot " << slot;
        ASSERT_EQ(r.row[static_cast<size_t>(ch)], e * c.slots + slot);
      }
    expect_bits(s.count.data(), stats.data(), E, "1st-choice counts");
    for (int64_t e = 0; e < E; ++e) {
      const float psum = emulate_column_sum(probs.data(), T, E, e);
      const float want = stats[static_cast<size_t>(E + e)];
      EXPECT_NEAR(psum, want, (static_cast<double>(T) + 16.0) * kU * want + 1e-30)
          << "psum of expert " << e;
    }

    // Gate backward: weights backward (one thread per row), softmax backward, then the
    // same products.
    std::vector<float> dweight = normal(T * k, 5);
    for (size_t i = 0; i < dweight.size(); ++i)
      if (r.row[i] < 0) dweight[i] = 0.0f;  // what combine_backward leaves for drops
    std::vector<float> dstats = normal(2 * E, 6);
    dstats.push_back(0.0f);  // no z-loss: the device gate has none
    Tensor dprobs({T, E}), dwg({M, E}), dx({T, M});
    moe::gate_backward(x, wg, probs, r, dweight, dstats.data(), dprobs, dwg, dx);
    std::vector<float> my_dp(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t)
      weights_backward_row(&expert[static_cast<size_t>(t * k)], &prob[static_cast<size_t>(t * k)],
                           &dweight[static_cast<size_t>(t * k)], k, dstats.data() + E, E,
                           &my_dp[static_cast<size_t>(t * E)]);
    // The CPU's own softmax backward of our weights backward: exact iff the latter is.
    std::vector<float> via_cpu(my_dp.size());
    cpu::softmax_backward(probs.data(), my_dp.data(), via_cpu.data(), T, E);
    expect_bits(via_cpu.data(), dprobs.data(), T * E, "weights backward");
    const std::vector<float> dp_in = my_dp;
    for (int64_t t = 0; t < T; ++t)  // in place, as the backend runs it
      softmax_backward_row(probs.row(t), &my_dp[static_cast<size_t>(t * E)],
                           &my_dp[static_cast<size_t>(t * E)], E);
    expect_dsoftmax(probs.data(), dp_in.data(), my_dp.data(), dprobs.data(), T, E, "dprobs");

    // Dispatch forward: every buffer row gathered (unfilled ones zeroed).
    Tensor buf({E * c.slots, M});
    buf.fill(kNaN);
    moe::dispatch_forward(x, r, buf);
    const std::vector<float> my_buf = emulate_gather(x.data(), s, nullptr, T, E, k, c.slots);
    expect_bits(my_buf.data(), buf.data(), buf.numel(), "dispatch forward");

    // Dispatch backward: one block per token, its choices in order.
    const Tensor dbuf = tensor_of(normal(E * c.slots * M, 7), {E * c.slots, M});
    Tensor dx_cpu = tensor_of(normal(T * M, 8), {T, M});
    std::vector<float> my_dx(dx_cpu.data(), dx_cpu.data() + dx_cpu.numel());
    moe::dispatch_backward(dbuf, r, dx_cpu);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m)
        my_dx[static_cast<size_t>(t * M + m)] = dispatch_backward_element(
            my_dx[static_cast<size_t>(t * M + m)], &s.row[static_cast<size_t>(t * k)], k,
            dbuf.data(), M, m);
    expect_bits(my_dx.data(), dx_cpu.data(), T * M, "dispatch backward");

    // Combine forward.
    const Tensor ybuf = tensor_of(normal(E * c.slots * M, 9), {E * c.slots, M});
    Tensor out({T, M});
    out.fill(kNaN);
    moe::combine_forward(ybuf, r, out);
    std::vector<float> my_out(static_cast<size_t>(T * M));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m)
        my_out[static_cast<size_t>(t * M + m)] =
            combine_element(&s.row[static_cast<size_t>(t * k)],
                            &weight[static_cast<size_t>(t * k)], k, ybuf.data(), M, m);
    expect_bits(my_out.data(), out.data(), T * M, "combine forward");

    // Combine backward: dbuf gathered with the weights as scale; dweight by 16 lanes.
    const Tensor dout = tensor_of(normal(T * M, 10), {T, M});
    Tensor dbuf_cpu({E * c.slots, M});
    dbuf_cpu.fill(kNaN);
    std::vector<float> dweight_cpu;
    moe::combine_backward(ybuf, dout, r, dbuf_cpu, dweight_cpu);
    const std::vector<float> my_dbuf =
        emulate_gather(dout.data(), s, weight.data(), T, E, k, c.slots);
    expect_bits(my_dbuf.data(), dbuf_cpu.data(), dbuf_cpu.numel(), "combine backward dbuf");
    std::vector<float> my_dweight(static_cast<size_t>(T * k));
    for (int64_t ch = 0; ch < T * k; ++ch) {
      const int32_t row = s.row[static_cast<size_t>(ch)];
      float partial[kLanes] = {};
      for (int lane = 0; lane < kLanes; ++lane)
        if (row >= 0)
          partial[lane] = dot_lane(dout.row(ch / k), ybuf.data() + int64_t{row} * M, M, lane);
      my_dweight[static_cast<size_t>(ch)] = row >= 0 ? sum_lanes(partial) : 0.0f;
    }
    expect_bits(my_dweight.data(), dweight_cpu.data(), T * k, "combine backward dweight");

    ++checked;
    const int64_t kept =
        std::count_if(r.row.begin(), r.row.end(), [](int64_t v) { return v >= 0; });
    with_drops += kept < T * k;
    multi_chunk += T * k > kSlotChunk;
    if (HasFatalFailure()) return;
  }
  std::printf("[ info ] %d gate cases, %d with drops, %d over several scan chunks\n", checked,
              with_drops, multi_chunk);
  EXPECT_GT(with_drops, 10);
  EXPECT_GT(multi_chunk, 3);
}

// Dropless, packed layout: the device gate's renumbering (moe_pack_routing: packed_starts
// and packed_row, emulated as its grid runs them) gives the rows and starts of the CPU's
// moe::pack_routing, and the choice scatter (moe_scatter_choices) the CPU's packed dispatch
// and combine-backward buffers; dispatch backward and combine forward read the packed rows.
// Skewed routings: every token to experts 0..k-1 (uniform logits), or to the last expert
// and its neighbours (a dominant logit), so some experts take every token and others none.
TEST(CudaMoeMath, PackedRoutingMatchesCpu) {
  const int64_t M = kModelDim;
  int checked = 0, skewed = 0;
  for (int64_t T : {1, 7, 300, 4500})
    for (int64_t E : {1, 3, 8, 20})
      for (int k : {1, 2, static_cast<int>(E)}) {
        if (k > E) continue;
        for (int variant = 0; variant < 3; ++variant) {
          const GateCase c{T, E, k, T, T, variant == 1 ? Logits::kUniform : Logits::kRandom};
          SCOPED_TRACE(c.name() + " variant " + std::to_string(variant));
          Tensor x, wg;
          make_gate_inputs(c, x, wg);
          if (variant == 2) {  // feature 0 pulls every token to the last expert, then down
            for (int64_t t = 0; t < T; ++t) x.at(t, 0) = 8.0f;
            for (int64_t e = 0; e < E; ++e) wg.at(0, e) = static_cast<float>(e);
          }
          Tensor probs({T, E});
          moe::GateRouting r;
          std::vector<float> stats(static_cast<size_t>(2 * E + 1));
          moe::gate_forward(x, wg, k, T, T, probs, r, stats.data());
          const Slots s = emulate_slots(r.expert, T, E, k, T, T);
          moe::pack_routing(r);

          // The pack kernel: each block computes the starts, then renumbers its choices.
          std::vector<int32_t> first(static_cast<size_t>(E), -7);
          const int64_t routed = packed_starts(s.fill.data(), E, first.data());
          ASSERT_EQ(routed, T * k) << "dropless routes every choice";
          ASSERT_EQ(std::vector<int64_t>(first.begin(), first.end()), r.first);
          std::vector<int32_t> row(s.row.size());
          for (size_t ch = 0; ch < row.size(); ++ch) {
            const int32_t e = r.expert[ch];
            row[ch] = packed_row(s.row[ch], e, T, first[static_cast<size_t>(e)]);
          }
          ASSERT_EQ(std::vector<int64_t>(row.begin(), row.end()), r.row);

          // Dispatch forward and the combine's dbuf: one "block" per choice.
          auto scatter = [&](const float* src, const float* scale) {
            std::vector<float> buf(static_cast<size_t>(routed * M), kNaN);
            for (int64_t ch = 0; ch < T * k; ++ch) {
              const int32_t rr = row[static_cast<size_t>(ch)];
              if (rr < 0) continue;
              const float* xs = src + choice_token(ch, k) * M;
              for (int64_t m = 0; m < M; ++m)
                buf[static_cast<size_t>(rr * M + m)] =
                    scale == nullptr ? xs[m] : mul_nc(scale[ch], xs[m]);
            }
            return buf;
          };
          Tensor buf({routed, M});
          buf.fill(kNaN);
          moe::dispatch_forward(x, r, buf, false);
          const std::vector<float> my_buf = scatter(x.data(), nullptr);
          expect_bits(my_buf.data(), buf.data(), buf.numel(), "packed dispatch forward");

          const Tensor ybuf = tensor_of(normal(routed * M, 11), {routed, M});
          const Tensor dout = tensor_of(normal(T * M, 12), {T, M});
          Tensor dbuf({routed, M});
          dbuf.fill(kNaN);
          std::vector<float> dweight;
          moe::combine_backward(ybuf, dout, r, dbuf, dweight, false);
          const std::vector<float> my_dbuf = scatter(dout.data(), r.weight.data());
          expect_bits(my_dbuf.data(), dbuf.data(), dbuf.numel(), "packed combine backward dbuf");

          // Combine forward and dispatch backward through the packed rows.
          Tensor out({T, M});
          moe::combine_forward(ybuf, r, out);
          Tensor dx = tensor_of(normal(T * M, 13), {T, M});
          std::vector<float> my_dx(dx.data(), dx.data() + dx.numel());
          moe::dispatch_backward(ybuf, r, dx);
          std::vector<float> my_out(static_cast<size_t>(T * M));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t m = 0; m < M; ++m) {
              const size_t i = static_cast<size_t>(t * M + m);
              my_out[i] = combine_element(&row[static_cast<size_t>(t * k)],
                                          &r.weight[static_cast<size_t>(t * k)], k,
                                          ybuf.data(), M, m);
              my_dx[i] = dispatch_backward_element(my_dx[i], &row[static_cast<size_t>(t * k)],
                                                   k, ybuf.data(), M, m);
            }
          expect_bits(my_out.data(), out.data(), T * M, "packed combine forward");
          expect_bits(my_dx.data(), dx.data(), T * M, "packed dispatch backward");
          ++checked;
          skewed += std::count(r.fill.begin(), r.fill.end(), 0) > 0 &&
                    *std::max_element(r.fill.begin(), r.fill.end()) == T;
          if (HasFatalFailure()) return;
        }
      }
  std::printf("[ info ] %d packed cases, %d with an expert taking every token and one none\n",
              checked, skewed);
  EXPECT_GT(skewed, 10);
}

TEST(CudaMoeMath, PackedRowFollowsTheExpertsBefore) {
  // fill (2, 0, 3): starts (0, 2, 2); slot 1 of expert 2 (row 2 * 5 + 1 with 5 slots) -> 3.
  const int32_t fill[] = {2, 0, 3};
  int32_t first[3] = {-1, -1, -1};
  EXPECT_EQ(packed_starts(fill, 3, first), 5);
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(first[1], 2);
  EXPECT_EQ(first[2], 2);
  EXPECT_EQ(packed_row(11, 2, 5, first[2]), 3);
  EXPECT_EQ(packed_row(1, 0, 5, first[0]), 1);
  EXPECT_EQ(packed_row(-1, 2, 5, first[2]), -1);
  EXPECT_EQ(choice_token(7, 2), 3);
}

TEST(CudaMoeMath, DotLanesMatchCpuForEveryLengthMod16) {
  // dot_lane + sum_lanes against the CPU combine's dweight for lengths around 16 multiples.
  for (int64_t M : {1, 5, 15, 16, 17, 31, 32, 33, 100}) {
    moe::GateRouting r;
    r.tokens = 1;
    r.experts = 1;
    r.topk = 1;
    r.capacity = 1;
    r.slots = 1;
    r.expert = {0};
    r.prob = {1.0f};
    r.weight = {0.75f};
    r.row = {0};
    r.fill = {1};
    const Tensor buf = tensor_of(normal(M, 20 + M), {1, M});
    const Tensor dout = tensor_of(normal(M, 40 + M), {1, M});
    Tensor dbuf({1, M});
    std::vector<float> dweight;
    moe::combine_backward(buf, dout, r, dbuf, dweight);
    float partial[kLanes];
    for (int lane = 0; lane < kLanes; ++lane)
      partial[lane] = dot_lane(dout.data(), buf.data(), M, lane);
    const float got = sum_lanes(partial);
    EXPECT_EQ(bits(got), bits(dweight[0])) << "M " << M;
  }
}

TEST(CudaMoeMath, SlotRuleAndPriorityOrder) {
  // T = 3, k = 2: priority i = j * T + t -> choice t * k + j.
  const int64_t want[] = {0, 2, 4, 1, 3, 5};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(priority_choice(i, 3, 2), want[i]) << i;
  EXPECT_EQ(slot_row(2, 0, 3, 5), 10);
  EXPECT_EQ(slot_row(2, 2, 3, 5), 12);
  EXPECT_EQ(slot_row(2, 3, 3, 5), -1);
  EXPECT_EQ(slot_row(0, 0, 0, 4), -1);  // capacity 0 drops everything
}

}  // namespace
}  // namespace parm::math
