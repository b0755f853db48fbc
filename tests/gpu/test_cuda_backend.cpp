// The CUDA LayerBackend (src/moe/cuda/cuda_backend.h) against the CPU functions of
// moe/moe_ops.h on the same inputs: gate forward/backward, l_aux and its adjoint, dispatch
// and combine forward/backward, and the local data movement. Skips without a GPU.
//
// Inputs make the routing exactly predictable on both sides: x and wg hold integers in
// [-4, 4] divided by 4, so every logit is a multiple of 1/16 computed exactly in any order
// (cuBLAS and oneDNN alike, TF32 or not). Distinct logits then give probabilities at least
// 6% apart, equal logits (ties: plenty at these values, plus tied columns and an all-zero
// gate) give equal probabilities on both sides: the routing (expert, row, fill, 1st-choice
// counts) must be identical.
//
// Tolerances (u = 2^-24), each as max |gpu - cpu| <= rtol * max |cpu| over a tensor:
// - chosen probabilities, combine weights: 1e-6 (16 u). The softmax is the CPU's operation
//   order (kernels/math/moe_math.h): the same bits where the CPU runs its FMA clone (any
//   AVX2 host), a few ulp of exp otherwise.
// - dispatch forward/backward, combine forward and its dbuf: 1e-6; combine dweight (an
//   M-term dot product): 1e-5. They are the CPU's own sums in the CPU's order (expected the
//   same bits; the test prints any difference it sees): the tolerances only guard against a
//   CPU build that fuses products differently (-march=native).
// - probability sums: (T + 16) u of the sum (a fixed tree against the CPU's token order,
//   whose error bound is (T - 1) u); l_aux, made of them: (T + 24) u; the dstats of l_aux
//   exactly (they depend on the exact counts only).
// - gate gradients dwg (M, E), dx (rows, M): 2e-5. cuBLAS and oneDNN sum in different orders
//   (about sqrt(n) u of the terms' size for n <= 300 terms) and the softmax backward rounds
//   its dot product a few ulp differently; a wrong index or a missing term is off by O(1).
// - take_chunk, interleave, add: exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moe/cuda/cuda_backend.h"
#include "moe/moe_ops.h"
#include "moe/phase_times.h"
#include "parm/device.h"
#include "parm/rng.h"
#include "parm/tensor.h"

namespace parm::moe {
namespace {

constexpr uint64_t kSeed = 20250612;
constexpr double kU = 0x1p-24;
constexpr double kRoutedTol = 1e-6;
constexpr double kDotTol = 1e-5;
constexpr double kGateGradTol = 2e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

#define PARM_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                          \
    if (parm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
  } while (0)

Tensor host_quarters(Shape shape, uint64_t stream) {
  Tensor t(std::move(shape));
  Rng rng(kSeed, stream);
  for (int64_t i = 0; i < t.numel(); ++i)
    t[i] = static_cast<float>(static_cast<int>(rng.next_u32() % 9) - 4) * 0.25f;
  return t;
}

Tensor host_normal(Shape shape, uint64_t stream) {
  Tensor t(std::move(shape));
  Rng rng(kSeed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = rng.normal();
  return t;
}

Tensor host_filled(Shape shape, float v) {
  Tensor t(std::move(shape));
  t.fill(v);
  return t;
}

Tensor on_gpu(const Tensor& t) { return t.to(Device::kCuda); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::kCpu); }

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Bit differences seen per quantity over all cases (reported, not asserted).
struct BitReport {
  std::string name;
  int64_t differ = 0, total = 0;
};
std::vector<BitReport>& bit_reports() {
  static std::vector<BitReport> r;
  return r;
}
void note_bits(const std::string& name, const float* got, const float* want, int64_t n) {
  auto& list = bit_reports();
  auto it =
      std::find_if(list.begin(), list.end(), [&](const BitReport& b) { return b.name == name; });
  if (it == list.end()) it = list.insert(list.end(), BitReport{name});
  for (int64_t i = 0; i < n; ++i) it->differ += bits(got[i]) != bits(want[i]);
  it->total += n;
}

// max |got - want| <= rtol * max |want| (+ the smallest normal, for all-zero tensors).
void expect_close(const float* got, const float* want, int64_t n, double rtol,
                  const std::string& what) {
  double max_want = 0.0, max_err = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    max_want = std::max(max_want, std::fabs(static_cast<double>(want[i])));
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= max_err)) {  // NaN counts as worst
      max_err = std::isnan(err) ? INFINITY : err;
      worst = i;
    }
  }
  const double tol = rtol * max_want + std::numeric_limits<float>::min();
  EXPECT_LE(max_err, tol) << what << ": worst element " << worst << " = "
                          << (worst >= 0 ? got[worst] : 0.0f) << " vs "
                          << (worst >= 0 ? want[worst] : 0.0f) << " (max |want| " << max_want
                          << ", " << n << " elements)";
  note_bits(what, got, want, n);
}
void expect_close(const Tensor& got_device, const Tensor& want_host, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got_device.numel(), want_host.numel()) << what;
  const Tensor got = on_cpu(got_device);
  expect_close(got.data(), want_host.data(), got.numel(), rtol, what);
}

void expect_same_bits(const Tensor& got_device, const Tensor& want_host,
                      const std::string& what) {
  ASSERT_EQ(got_device.numel(), want_host.numel()) << what;
  const Tensor got = on_cpu(got_device);
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) bad += bits(got[i]) != bits(want_host[i]);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ";
}

enum class Gate { kQuarters, kTiedColumns, kZero };

struct Case {
  int64_t T, E;
  int k;
  int64_t capacity, slots, M;
  Gate gate;
  std::string name() const {
    return "T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
           " C=" + std::to_string(capacity) + " slots=" + std::to_string(slots) +
           " M=" + std::to_string(M) + " gate=" + std::to_string(static_cast<int>(gate));
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  int v = 0;
  auto add = [&](int64_t T, int64_t E, int k, int64_t C) {
    const int64_t slots = C + (v % 2) * 3;  // slots == C, or padded (S2's Cp)
    const int64_t M = v % 3 == 2 ? 13 : 16;  // 16: the float4 paths; 13: the scalar ones
    out.push_back({T, E, k, C, slots, M, static_cast<Gate>(v % 3)});
    ++v;
  };
  for (int64_t T : {1, 37, 300})
    for (int64_t E : {1, 2, 5, 8}) {
      std::vector<int> ks = {1};
      if (E >= 2) ks.push_back(2);
      if (E > 2) ks.push_back(static_cast<int>(E));
      for (int k : ks) {
        const int64_t demand = (k * T + E - 1) / E;  // capacity factor 1
        add(T, E, k, std::max<int64_t>(1, demand / 2));  // drops
        add(T, E, k, demand);
        add(T, E, k, T);  // never drops
      }
    }
  add(50, 4, 2, 0);  // capacity 0: everything dropped, an empty dispatch buffer
  // Several chunks of the slot scan (4096 priority positions each).
  add(5000, 4, 1, 1000);
  add(3000, 8, 2, 700);
  add(2100, 8, 8, 2100);
  return out;
}

BackendSizes sizes_for(const Case& c) {
  BackendSizes s;
  s.gate_rows = c.T;
  s.experts = c.E;
  s.topk = c.k;
  s.model_dim = c.M;
  s.local_experts = 1;
  s.hidden_shard = 8;
  s.max_expert_rows = 16;
  return s;
}

std::unique_ptr<CudaBackend> backend_for(const Case& c) {
  return std::make_unique<CudaBackend>(Precision::kFp32, sizes_for(c));
}

TEST(CudaBackend, GateDispatchCombineMatchCpu) {
  PARM_SKIP_WITHOUT_GPU();
  int checked = 0, with_drops = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const int64_t T = c.T, E = c.E, M = c.M;
    const int k = c.k;
    const auto backend = backend_for(c);

    const Tensor x = host_quarters({T, M}, 1);
    Tensor wg = host_quarters({M, E}, 2);
    if (c.gate == Gate::kTiedColumns)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t e = 1; e < E; e += 2) wg.at(m, e) = wg.at(m, e - 1);
    if (c.gate == Gate::kZero) wg.zero();
    const Tensor x_d = on_gpu(x), wg_d = on_gpu(wg);

    // ---- gate forward ----
    Tensor probs({T, E});
    GateRouting r;
    std::vector<float> stats(static_cast<size_t>(2 * E + 1));
    gate_forward(x, wg, k, c.capacity, c.slots, probs, r, stats.data());
    Tensor stats_d = on_gpu(host_filled({2 * E + 1}, kNaN));
    backend->gate_forward(x_d, wg_d, k, c.capacity, c.slots, stats_d.data(), nullptr);

    EXPECT_EQ(backend->fill(), r.fill);
    const GateRouting& g = backend->routing();
    ASSERT_EQ(g.tokens, T);
    ASSERT_EQ(g.expert, r.expert);
    ASSERT_EQ(g.row, r.row);
    ASSERT_EQ(g.fill, r.fill);
    expect_close(backend->last_probs(), probs, kRoutedTol, "probabilities");
    expect_close(g.prob.data(), r.prob.data(), T * k, kRoutedTol, "chosen probabilities");
    expect_close(g.weight.data(), r.weight.data(), T * k, kRoutedTol, "combine weights");
    const Tensor stats_g = on_cpu(stats_d);
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(stats_g[e], stats[static_cast<size_t>(e)]) << "1st-choice count of " << e;
      const double want = stats[static_cast<size_t>(E + e)];
      EXPECT_NEAR(stats_g[E + e], want, (static_cast<double>(T) + 16.0) * kU * want + 1e-30)
          << "psum of " << e;
    }

    // ---- l_aux and its adjoint ----
    const float l_aux = aux_loss(stats.data(), E, T);
    EXPECT_NEAR(backend->aux_loss(stats_d.data(), E, T, 1), l_aux,
                (static_cast<double>(T) + 24.0) * kU * std::fabs(l_aux) + 1e-30);
    const float dl_aux = 0.37f;
    std::vector<float> dstats(static_cast<size_t>(2 * E + 1));
    aux_loss_backward(stats.data(), E, T, dl_aux, 0.0f, dstats.data());
    Tensor dstats_d = on_gpu(host_filled({2 * E + 1}, kNaN));
    backend->aux_loss_backward(stats_d.data(), E, T, 1, dl_aux, 0.0f, dstats_d.data());
    expect_same_bits(dstats_d, Tensor::view(dstats.data(), {2 * E + 1}), "dstats");

    // ---- dispatch forward (the GPU buffer starts as NaN: every row must be written) ----
    Tensor buf({E * c.slots, M});
    dispatch_forward(x, r, buf);
    Tensor buf_d = on_gpu(host_filled({E * c.slots, M}, kNaN));
    backend->dispatch_forward(x_d, buf_d);
    expect_close(buf_d, buf, kRoutedTol, "dispatch forward");

    // ---- combine forward over expert outputs y ----
    const Tensor y = host_normal({E * c.slots, M}, 3);
    const Tensor y_d = on_gpu(y);
    Tensor out({T, M});
    combine_forward(y, r, out);
    Tensor out_d = on_gpu(host_filled({T, M}, kNaN));
    backend->combine_forward(y_d, out_d);
    expect_close(out_d, out, kRoutedTol, "combine forward");

    // ---- combine backward ----
    const Tensor dout = host_normal({T, M}, 4);
    Tensor dy({E * c.slots, M});
    std::vector<float> dweight;
    combine_backward(y, dout, r, dy, dweight);
    Tensor dy_d = on_gpu(host_filled({E * c.slots, M}, kNaN));
    const Tensor dout_d = on_gpu(dout);  // named: the queued kernels read it after this line
    backend->combine_backward(y_d, dout_d, dy_d);
    expect_close(dy_d, dy, kRoutedTol, "combine backward dbuf");
    expect_close(backend->last_dweight(), Tensor::view(dweight.data(), {T, k}), kDotTol,
                 "combine backward dweight");

    // ---- dispatch backward (accumulates into a non-zero dx) ----
    const Tensor dbuf = host_normal({E * c.slots, M}, 5);
    Tensor dx = host_normal({T, M}, 6);
    Tensor dx_d = on_gpu(dx);
    const Tensor dbuf_d = on_gpu(dbuf);
    dispatch_backward(dbuf, r, dx);
    backend->dispatch_backward(dbuf_d, dx_d);
    expect_close(dx_d, dx, kRoutedTol, "dispatch backward");

    // ---- gate backward (accumulates dwg and dx) ----
    Tensor dprobs({T, E});
    Tensor dwg = host_normal({M, E}, 7);
    Tensor dxg = host_normal({T, M}, 8);
    Tensor dwg_d = on_gpu(dwg), dxg_d = on_gpu(dxg);
    gate_backward(x, wg, probs, r, dweight, dstats.data(), dprobs, dwg, dxg);
    backend->gate_backward(x_d, wg_d, dstats_d.data(), dwg_d, dxg_d, nullptr);
    expect_close(dwg_d, dwg, kGateGradTol, "gate dwg");
    expect_close(dxg_d, dxg, kGateGradTol, "gate dx");

    ++checked;
    with_drops += std::count(r.row.begin(), r.row.end(), -1) > 0;
    if (HasFatalFailure()) return;
  }
  std::printf("[ info ] %d cases, %d with drops; bit differences from the CPU:\n", checked,
              with_drops);
  for (const BitReport& b : bit_reports())
    std::printf("[ info ]   %-28s %lld of %lld\n", b.name.c_str(),
                static_cast<long long>(b.differ), static_cast<long long>(b.total));
  EXPECT_GT(with_drops, 10);
}

// Dropless, packed layout (BackendSizes::packed): the device gate numbers rows first[e] +
// slot as moe::pack_routing does, and dispatch, combine and their adjoints over buffers of the
// routed rows (T k, nothing else) match the CPU's packed functions. Gate::kZero routes every
// token to experts 0..k-1 (the others get none).
TEST(CudaBackend, PackedDroplessMatchesCpu) {
  PARM_SKIP_WITHOUT_GPU();
  const Case packed_cases[] = {{37, 5, 2, 37, 37, 16, Gate::kQuarters},
                               {300, 8, 2, 300, 300, 16, Gate::kZero},
                               {300, 8, 1, 300, 300, 13, Gate::kZero},
                               {5000, 4, 2, 5000, 5000, 16, Gate::kQuarters},
                               {2100, 8, 8, 2100, 2100, 13, Gate::kQuarters}};
  for (const Case& c : packed_cases) {
    SCOPED_TRACE(c.name());
    const int64_t T = c.T, E = c.E, M = c.M, rows = T * c.k;
    BackendSizes sizes = sizes_for(c);
    sizes.dropless = true;
    sizes.packed = true;
    CudaBackend backend(Precision::kFp32, sizes);
    const Tensor x = host_quarters({T, M}, 21);
    Tensor wg = host_quarters({M, E}, 22);
    if (c.gate == Gate::kZero) wg.zero();
    const Tensor x_d = on_gpu(x), wg_d = on_gpu(wg);

    Tensor probs({T, E});
    GateRouting r;
    std::vector<float> stats(static_cast<size_t>(2 * E + 1));
    gate_forward(x, wg, c.k, T, T, probs, r, stats.data());
    pack_routing(r);
    Tensor stats_d({2 * E + 1}, Device::kCuda);
    backend.gate_forward(x_d, wg_d, c.k, T, T, stats_d.data(), nullptr);
    const GateRouting& g = backend.routing();
    ASSERT_EQ(g.expert, r.expert);
    ASSERT_EQ(g.fill, r.fill);
    ASSERT_EQ(g.first, r.first);
    ASSERT_EQ(g.row, r.row);

    Tensor buf({rows, M});
    dispatch_forward(x, r, buf, false);
    Tensor buf_d = on_gpu(host_filled({rows, M}, kNaN));
    backend.dispatch_forward(x_d, buf_d);
    expect_close(buf_d, buf, kRoutedTol, "packed dispatch forward");

    const Tensor y = host_normal({rows, M}, 23);
    const Tensor y_d = on_gpu(y);
    Tensor out({T, M});
    combine_forward(y, r, out);
    Tensor out_d = on_gpu(host_filled({T, M}, kNaN));
    backend.combine_forward(y_d, out_d);
    expect_close(out_d, out, kRoutedTol, "packed combine forward");

    const Tensor dout = host_normal({T, M}, 24);
    Tensor dy({rows, M});
    std::vector<float> dweight;
    combine_backward(y, dout, r, dy, dweight, false);
    Tensor dy_d = on_gpu(host_filled({rows, M}, kNaN));
    const Tensor dout_d = on_gpu(dout);
    backend.combine_backward(y_d, dout_d, dy_d);
    expect_close(dy_d, dy, kRoutedTol, "packed combine backward dbuf");
    expect_close(backend.last_dweight(), Tensor::view(dweight.data(), {T, c.k}), kDotTol,
                 "packed combine backward dweight");

    Tensor dx = host_normal({T, M}, 25);
    Tensor dx_d = on_gpu(dx);
    dispatch_backward(y, r, dx);
    backend.dispatch_backward(y_d, dx_d);
    expect_close(dx_d, dx, kRoutedTol, "packed dispatch backward");

    // A buffer short of the routed rows is refused before anything is written.
    Tensor short_d({rows - 1, M}, Device::kCuda);
    EXPECT_THROW(backend.dispatch_forward(x_d, short_d), parm::Error);
    if (HasFatalFailure()) return;
  }
}

// The same gate call twice gives the same bits (no atomics, no order that depends on timing).
TEST(CudaBackend, GateIsDeterministic) {
  PARM_SKIP_WITHOUT_GPU();
  const Case c{3000, 8, 2, 700, 700, 16, Gate::kQuarters};
  const auto backend = backend_for(c);
  const Tensor x_d = on_gpu(host_normal({c.T, c.M}, 11));
  const Tensor wg_d = on_gpu(host_normal({c.M, c.E}, 12));
  Tensor stats1({2 * c.E}, Device::kCuda), stats2({2 * c.E}, Device::kCuda);
  backend->gate_forward(x_d, wg_d, c.k, c.capacity, c.slots, stats1.data(), nullptr);
  const GateRouting first = backend->routing();
  const Tensor probs1 = on_cpu(backend->last_probs());
  backend->gate_forward(x_d, wg_d, c.k, c.capacity, c.slots, stats2.data(), nullptr);
  const GateRouting& second = backend->routing();
  EXPECT_EQ(first.expert, second.expert);
  EXPECT_EQ(first.row, second.row);
  EXPECT_EQ(first.fill, second.fill);
  expect_same_bits(backend->last_probs(), probs1, "probabilities");
  expect_same_bits(stats2, on_cpu(stats1), "stats");
}

TEST(CudaBackend, PhaseNamesAreTheCpuGates) {
  PARM_SKIP_WITHOUT_GPU();
  const Case c{64, 4, 2, 40, 40, 16, Gate::kQuarters};
  const auto backend = backend_for(c);
  const Tensor x_d = on_gpu(host_quarters({c.T, c.M}, 21));
  const Tensor wg_d = on_gpu(host_quarters({c.M, c.E}, 22));
  Tensor stats_d({2 * c.E}, Device::kCuda), dstats_d({2 * c.E}, Device::kCuda);
  PhaseTimes fwd, bwd;
  backend->gate_forward(x_d, wg_d, c.k, c.capacity, c.slots, stats_d.data(), &fwd);
  Tensor buf_d({c.E * c.slots, c.M}, Device::kCuda), dbuf_d({c.E * c.slots, c.M}, Device::kCuda);
  Tensor dout_d({c.T, c.M}, Device::kCuda);
  backend->combine_backward(buf_d, dout_d, dbuf_d);
  Tensor dwg_d({c.M, c.E}, Device::kCuda), dx_d({c.T, c.M}, Device::kCuda);
  backend->gate_backward(x_d, wg_d, dstats_d.data(), dwg_d, dx_d, &bwd);
  const std::vector<std::string> want_fwd = {"gate products", "softmax", "top-k",
                                             "slots + statistics"};
  const std::vector<std::string> want_bwd = {"top-k + weights backward", "softmax backward",
                                             "gate products"};
  ASSERT_EQ(fwd.num, 4);
  ASSERT_EQ(bwd.num, 3);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(fwd.names[i], want_fwd[static_cast<size_t>(i)]);
    EXPECT_GE(fwd.us[i], 0.0);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bwd.names[i], want_bwd[static_cast<size_t>(i)]);
  EXPECT_GT(backend->held_bytes(), 0);
}

// take_chunk / interleave / add against the CPU loops, exactly, on aligned float4 shapes
// and on odd ones (chunk not a multiple of 4, pointers off 16-byte alignment).
TEST(CudaBackend, LocalDataMovementIsExact) {
  PARM_SKIP_WITHOUT_GPU();
  const Case c{8, 2, 1, 8, 8, 16, Gate::kQuarters};
  const auto backend = backend_for(c);
  struct Shape3 {
    int64_t outer;
    int n;
    int64_t chunk;
    int64_t offset;  // floats: 1 misaligns the device pointers
  };
  for (const Shape3 s : {Shape3{3, 2, 8, 0}, Shape3{5, 4, 12, 0}, Shape3{7, 3, 5, 0},
                         Shape3{4, 2, 8, 1}, Shape3{1, 1, 3, 0}, Shape3{129, 4, 1024, 0}}) {
    SCOPED_TRACE("outer " + std::to_string(s.outer) + " n " + std::to_string(s.n) + " chunk " +
                 std::to_string(s.chunk) + " offset " + std::to_string(s.offset));
    const int64_t total = s.outer * s.n * s.chunk, part = s.outer * s.chunk;
    const Tensor full = host_normal({total + s.offset}, 31);
    const Tensor full_d = on_gpu(full);
    for (int j = 0; j < s.n; ++j) {
      Tensor mine_d = on_gpu(host_filled({part + s.offset}, kNaN));
      backend->take_chunk(full_d.data() + s.offset, s.outer, s.n, j, s.chunk,
                          mine_d.data() + s.offset);
      const Tensor mine = on_cpu(mine_d);
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.chunk; ++i)
          ASSERT_EQ(bits(mine[s.offset + o * s.chunk + i]),
                    bits(full[s.offset + (o * s.n + j) * s.chunk + i]))
              << "take_chunk j " << j << " o " << o << " i " << i;
    }
    const Tensor parts = host_normal({total + s.offset}, 32);
    const Tensor parts_d = on_gpu(parts);
    Tensor out_d = on_gpu(host_filled({total + s.offset}, kNaN));
    backend->interleave(parts_d.data() + s.offset, s.outer, s.n, s.chunk,
                        out_d.data() + s.offset);
    const Tensor out = on_cpu(out_d);
    for (int p = 0; p < s.n; ++p)
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.chunk; ++i)
          ASSERT_EQ(bits(out[s.offset + (o * s.n + p) * s.chunk + i]),
                    bits(parts[s.offset + (p * s.outer + o) * s.chunk + i]))
              << "interleave p " << p << " o " << o << " i " << i;

    Tensor dst = host_normal({total + s.offset}, 33);
    Tensor dst_d = on_gpu(dst);
    const Tensor src = host_normal({total + s.offset}, 34);
    const Tensor src_d = on_gpu(src);
    backend->add(dst_d.data() + s.offset, src_d.data() + s.offset, total);
    for (int64_t i = 0; i < total; ++i) dst[s.offset + i] += src[s.offset + i];
    expect_same_bits(dst_d, dst, "add");
  }
}

}  // namespace
}  // namespace parm::moe
