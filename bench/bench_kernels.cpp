// Micro-benchmarks of the CPU kernels, each against a ceiling measured on this machine when
// the binary starts: GEMMs against the best of a few 1024^3 GEMMs on one core (the
// `of_peak` counter; the bf16 expert products against the best 1024^3 bf16 GEMM), the
// memory-bound kernels against a large-array triad/copy (the `of_mem_bw` counter). Working
// sets below the last-level cache size can exceed 1 there. Besides the kernels of
// kernels.h: the six expert products in fp32 (ExpertGemm), bf16 (ExpertGemmBf16) and, as the
// yardstick of the bf16 kernel, oneDNN's own bf16 matmul on them (ExpertGemmOnednnBf16), and the
// MoE dispatch/combine forward and backward (moe_ops.h) at the reference MoE configuration.
//
//   OMP_NUM_THREADS=1 build/parm_kernel_bench [--benchmark_filter=Gemm]
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "shape/shape.h"
#include "moe/expert_products.h"
#include "moe/moe_ops.h"
#include "parm/rng.h"
#include "parm/tensor.h"
#include "parm/timer.h"

namespace {

using parm::cpu::GemmPath;

constexpr uint64_t kSeed = 17;

struct Ceilings {
  double gemm_flops = 0.0;  // FLOP/s
  double bf16_flops = 0.0;  // FLOP/s of the bf16 GEMM (packed operands)
  double mem_bytes = 0.0;   // bytes/s
};
Ceilings g_ceilings;

std::vector<float> random_vector(int64_t n, uint64_t stream) {
  parm::Rng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.normal();
  return v;
}

// Best of a few 1024^3 GEMMs on the default (single-thread) setting.
double measure_gemm_peak() {
  const int64_t n = 1024;
  const std::vector<float> a = random_vector(n * n, 1), b = random_vector(n * n, 2);
  std::vector<float> c(static_cast<size_t>(n * n));
  double best_us = 1e300;
  for (int rep = 0; rep < 6; ++rep) {  // the first also creates oneDNN's kernels
    parm::Timer t;
    parm::cpu::gemm(false, false, n, n, n, a.data(), b.data(), c.data(), false);
    best_us = std::min(best_us, t.elapsed_us());
  }
  return 2.0 * n * n * n / (best_us * 1e-6);
}

// Best of a few 1024^3 bf16 GEMMs on packed operands (the bf16 products' ceiling).
double measure_bf16_peak() {
  const int64_t n = 1024;
  const std::vector<float> a = random_vector(n * n, 1), b = random_vector(n * n, 2);
  parm::cpu::Bf16Buffer pa(static_cast<size_t>(parm::cpu::bf16_packed_a_size(n, n)));
  parm::cpu::Bf16Buffer pb(static_cast<size_t>(parm::cpu::bf16_packed_b_size(n, n)));
  parm::cpu::bf16_pack_a(false, n, n, a.data(), n, pa.data());
  parm::cpu::bf16_pack_b(false, n, n, b.data(), n, pb.data());
  std::vector<float> c(static_cast<size_t>(n * n));
  double best_us = 1e300;
  for (int rep = 0; rep < 6; ++rep) {
    parm::Timer t;
    parm::cpu::gemm_bf16_packed(n, n, n, pa.data(), pb.data(), c.data(), n, false);
    best_us = std::min(best_us, t.elapsed_us());
  }
  return 2.0 * n * n * n / (best_us * 1e-6);
}

// Best of a triad (a = b + s c, 3 x 64 MiB: 3 arrays of traffic) and a 128 MiB memcpy (read
// + write), both far larger than the last-level cache.
double measure_memory_bandwidth() {
  const size_t n = size_t{16} << 20;  // floats per array
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {
    parm::Timer t;
    float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    const float* __restrict pc = c.data();
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
    best = std::max(best, 3.0 * n * sizeof(float) / (t.elapsed_us() * 1e-6));
  }
  std::vector<float> big_src(2 * n, 1.0f), big_dst(2 * n, 0.0f);
  for (int rep = 0; rep < 4; ++rep) {
    parm::Timer t;
    std::memcpy(big_dst.data(), big_src.data(), big_src.size() * sizeof(float));
    benchmark::DoNotOptimize(big_dst.data());
    benchmark::ClobberMemory();
    best = std::max(best, 2.0 * big_src.size() * sizeof(float) / (t.elapsed_us() * 1e-6));
  }
  return best;
}

// Counters: FLOP/s and the fraction of the measured GEMM peak. Both are rates, so Google
// Benchmark divides by the elapsed time; dividing the work by the ceiling first yields the
// fraction directly.
void set_flop_counters(benchmark::State& state, double flops_per_iter, bool bf16 = false) {
  const double flops = flops_per_iter * static_cast<double>(state.iterations());
  const double peak = bf16 ? g_ceilings.bf16_flops : g_ceilings.gemm_flops;
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["of_peak"] = benchmark::Counter(flops / peak, benchmark::Counter::kIsRate);
}

void set_byte_counters(benchmark::State& state, double bytes_per_iter) {
  const double bytes = bytes_per_iter * static_cast<double>(state.iterations());
  state.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["of_mem_bw"] =
      benchmark::Counter(bytes / g_ceilings.mem_bytes, benchmark::Counter::kIsRate);
}

// ---- GEMM: args = m, n, k, trans_a, trans_b, accumulate, path ---------------------------

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0, acc = state.range(5) != 0;
  const auto path = static_cast<GemmPath>(state.range(6));
  const std::vector<float> a = random_vector(m * k, 3), b = random_vector(k * n, 4);
  std::vector<float> c(static_cast<size_t>(m * n), 0.0f);
  const GemmPath saved = parm::cpu::gemm_path();
  parm::cpu::set_gemm_path(path);
  for (auto _ : state) {
    parm::cpu::gemm(ta, tb, m, n, k, a.data(), b.data(), c.data(), acc);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  parm::cpu::set_gemm_path(saved);
  set_flop_counters(state, 2.0 * m * n * k);
}

// Expert FFN of the MoE layer: M = 512, H = 2048, T_e tokens per expert.
constexpr int64_t kM = 512, kH = 2048;

void gemm_cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "ta", "tb", "acc", "path"});
  const int64_t kAuto = static_cast<int64_t>(GemmPath::kAuto);
  b->Args({1024, 1024, 1024, 0, 0, 0, kAuto});
  for (int64_t te : {256, 512})
    for (int64_t path : {0, 1, 2}) {         // auto, sgemm, matmul: keeps the choice checkable
      b->Args({te, kH, kM, 0, 0, 0, path});  // h = x W1: (T_e, M) x (M, H)
      b->Args({kM, kH, te, 1, 0, 1, path});  // dW1 += x^T dh: (M, T_e) x (T_e, H)
      b->Args({te, kM, kH, 0, 1, 0, path});  // dx = dh W1^T: (T_e, H) x (H, M)
    }
}
BENCHMARK(BM_Gemm)->Apply(gemm_cases)->UseRealTime()->MinTime(0.2);

// ---- Expert products: the six GEMMs of one expert, as experts_forward/backward call them ----
// Shapes of the reference MoE configuration for one expert holding R = 512 filled rows,
// M = 512, H the hidden size per shard (2048 whole, 1024 for a 2-way expert shard), from
// moe::expert_gemm; operands contiguous, the layer's GEMM path. FLOPs = 2 m n k per call.
constexpr int64_t kR = 512;

using parm::moe::ExpertProduct;

// arg: H.
void BM_ExpertGemm(benchmark::State& state, ExpertProduct product) {
  const int64_t h = state.range(0);
  const parm::moe::GemmCall g = parm::moe::expert_gemm(product, kR, kM, h);
  // A is stored (m, k) or (k, m), B (k, n) or (n, k): the element counts do not depend on
  // the transposition.
  const std::vector<float> a = random_vector(g.m * g.k, 21), b = random_vector(g.k * g.n, 22);
  std::vector<float> c(static_cast<size_t>(g.m * g.n), 0.0f);
  const GemmPath saved = parm::cpu::gemm_path();
  parm::cpu::set_gemm_path(GemmPath::kAuto);  // no forced path: the layer's own
  for (auto _ : state) {
    parm::moe::run_expert_gemm(product, kR, kM, h, a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  parm::cpu::set_gemm_path(saved);
  set_flop_counters(state, g.flops());
  state.SetLabel(fmt::format("m={} n={} k={}{}{}{}", g.m, g.n, g.k, g.trans_a ? " ta" : "",
                             g.trans_b ? " tb" : "", g.accumulate ? " acc" : ""));
}

// The same six products at --precision bf16 over R rows (args H, R): operands packed to bf16
// before the loop (the layer packs the weights once per pass and the rows per call; this is
// the product alone, as the bf16 floor counts it), of_peak against the bf16 peak.
void BM_ExpertGemmBf16(benchmark::State& state, ExpertProduct product) {
  const int64_t h = state.range(0), rows = state.range(1);
  const parm::moe::GemmCall g = parm::moe::expert_gemm(product, rows, kM, h);
  const std::vector<float> a = random_vector(g.m * g.k, 21), b = random_vector(g.k * g.n, 22);
  parm::cpu::Bf16Buffer pa(static_cast<size_t>(parm::cpu::bf16_packed_a_size(g.m, g.k)));
  parm::cpu::Bf16Buffer pb(static_cast<size_t>(parm::cpu::bf16_packed_b_size(g.k, g.n)));
  parm::cpu::bf16_pack_a(g.trans_a, g.m, g.k, a.data(), g.trans_a ? g.m : g.k, pa.data());
  parm::cpu::bf16_pack_b(g.trans_b, g.k, g.n, b.data(), g.trans_b ? g.k : g.n, pb.data());
  std::vector<float> c(static_cast<size_t>(g.m * g.n), 0.0f);
  for (auto _ : state) {
    parm::cpu::gemm_bf16_packed(g.m, g.n, g.k, pa.data(), pb.data(), c.data(), g.n,
                                g.accumulate);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flop_counters(state, g.flops(), /*bf16=*/true);
  state.SetLabel(fmt::format("m={} n={} k={}{}{}{} {}", g.m, g.n, g.k, g.trans_a ? " ta" : "",
                             g.trans_b ? " tb" : "", g.accumulate ? " acc" : "",
                             parm::cpu::bf16_kernel_name()));
}
// The yardstick of BM_ExpertGemmBf16: oneDNN's bf16 x bf16 -> fp32 matmul primitive on the
// same product (its AMX brgemm here), the weights-side operand in the layout oneDNN prefers
// (reordered once, as a packed weight), created before the loop: its best case.
void BM_ExpertGemmOnednnBf16(benchmark::State& state, ExpertProduct product) {
  using dnnl::memory;
  const int64_t h = state.range(0);
  const parm::moe::GemmCall g = parm::moe::expert_gemm(product, kR, kM, h);
  const auto bf16 = memory::data_type::bf16, f32 = memory::data_type::f32;
  const auto tag = [](bool trans) { return trans ? memory::format_tag::ba : memory::format_tag::ab; };
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_f32({g.m, g.k}, f32, tag(g.trans_a)), b_f32({g.k, g.n}, f32, tag(g.trans_b));
  const memory::desc a_md({g.m, g.k}, bf16, tag(g.trans_a));
  const memory::desc c_md({g.m, g.n}, f32, memory::format_tag::ab);
  const memory::desc b_any({g.k, g.n}, bf16, memory::format_tag::any);
  dnnl::primitive_attr attr;
  if (g.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  // Checked before any work: oneDNN has no bf16 matmul on a CPU without bf16 instructions
  // (AVX2 only, e.g. Zen 3), and the primitive descriptor's constructor throws there.
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_any, c_md), attr, engine);
  } catch (const dnnl::error& e) {
    state.SkipWithError(fmt::format("oneDNN offers no bf16 x bf16 -> fp32 matmul on this CPU "
                                    "({}; CPU {}; GEMM backend {})",
                                    e.what(), parm::cpu::cpu_bf16_capability(),
                                    parm::cpu::gemm_backend())
                            .c_str());
    return;
  }
  std::vector<float> a = random_vector(g.m * g.k, 21), b = random_vector(g.k * g.n, 22);
  std::vector<float> c(static_cast<size_t>(g.m * g.n), 0.0f);
  memory a_src(a_f32, engine, a.data()), b_src(b_f32, engine, b.data());
  memory a_mem(a_md, engine), b_mem(pd.weights_desc(), engine), c_mem(c_md, engine, c.data());
  dnnl::reorder(a_src, a_mem).execute(stream, a_src, a_mem);
  dnnl::reorder(b_src, b_mem).execute(stream, b_src, b_mem);
  const dnnl::matmul matmul(pd);
  const std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  for (auto _ : state) {
    matmul.execute(stream, args);
    stream.wait();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flop_counters(state, g.flops(), /*bf16=*/true);
  state.SetLabel(fmt::format("m={} n={} k={}{}{}{} oneDNN {}", g.m, g.n, g.k,
                             g.trans_a ? " ta" : "", g.trans_b ? " tb" : "",
                             g.accumulate ? " acc" : "", pd.impl_info_str()));
}
// The layer's bf16 expert products for one pass (forward and backward) of 4 experts x kR
// rows, as experts_forward / experts_backward run them at bf16 without a weight version: all
// weight layouts packed once per pass, the row operands per call (with db2), bias + GeLU and
// its backward fused with the packing. Against BM_ExpertProductsBf16Floor (the same GEMMs on operands packed before the
// clock, as bench-layer's floor): the difference is the packing and the GeLU.
void BM_ExpertPassBf16(benchmark::State& state) {
  constexpr int64_t kExperts = 4;
  const int64_t h = kH;
  const std::vector<float> w1 = random_vector(kExperts * kM * h, 31),
                           w2 = random_vector(kExperts * h * kM, 32);
  const std::vector<float> x = random_vector(kR * kM, 33), b1 = random_vector(kExperts * h, 34),
                           dy = random_vector(kR * kM, 35);
  std::vector<float> pre(static_cast<size_t>(kExperts * kR * h)), out(static_cast<size_t>(kR * kM));
  std::vector<float> dact(static_cast<size_t>(kR * h)), dx(out.size()), dw1(w1.size()),
      dw2(w2.size()), db1(b1.size()), db2(static_cast<size_t>(kExperts * kM));
  parm::moe::Bf16ExpertProducts products;
  products.reserve(kExperts, kR, kM, h);
  for (auto _ : state) {
    products.pack_weights(w1.data(), w2.data());
    for (int64_t e = 0; e < kExperts; ++e) {
      float* pre_e = pre.data() + e * kR * h;
      products.fc1_forward(e, kR, parm::moe::RowRuns::contiguous(x.data(), kR, kM), pre_e);
      products.bias_gelu_fc2_forward(e, kR, pre_e, b1.data() + e * h, out.data());
    }
    for (int64_t e = 0; e < kExperts; ++e) {
      products.fc2_backward(e, kR, parm::moe::RowRuns::contiguous(dy.data(), kR, kM),
                            db2.data() + e * kM, dw2.data() + e * h * kM, dact.data());
      products.gelu_backward_fc1_backward(e, kR, pre.data() + e * kR * h, dact.data(),
                                          db1.data() + e * h, dw1.data() + e * kM * h,
                                          dx.data());
    }
    benchmark::ClobberMemory();
  }
  set_flop_counters(state, kExperts * parm::moe::expert_product_flops(kR, kM, h), true);
}
BENCHMARK(BM_ExpertPassBf16)->UseRealTime()->MinTime(0.5);
void BM_ExpertProductsBf16Floor(benchmark::State& state) {
  const std::vector<int64_t> rows(4, kR);
  for (auto _ : state) {
    const double us = parm::moe::time_expert_products_us(rows, kM, kH, 1, parm::Precision::kBf16);
    state.SetIterationTime(us * 1e-6);
  }
  set_flop_counters(state, 4 * parm::moe::expert_product_flops(kR, kM, kH), true);
}
BENCHMARK(BM_ExpertProductsBf16Floor)->UseManualTime()->MinTime(0.5);

// The six products, fp32 (BM_ExpertGemm) bf16 (BM_ExpertGemmBf16) and oneDNN bf16
// (BM_ExpertGemmOnednnBf16).
#define PARM_EXPERT_GEMM(fn, row_name, product) \
  BENCHMARK_CAPTURE(fn, row_name, product)       \
      ->ArgName("H")                             \
      ->Arg(kH)                                  \
      ->Arg(kH / 2)                              \
      ->UseRealTime()                            \
      ->MinTime(0.2)
#define PARM_EXPERT_GEMMS(fn)                                  \
  PARM_EXPERT_GEMM(fn, fwd_pre_x_W1, ExpertProduct::kPre);     \
  PARM_EXPERT_GEMM(fn, fwd_y_act_W2, ExpertProduct::kOut);     \
  PARM_EXPERT_GEMM(fn, bwd_dW2_actT_dy, ExpertProduct::kDW2);  \
  PARM_EXPERT_GEMM(fn, bwd_dact_dy_W2T, ExpertProduct::kDAct); \
  PARM_EXPERT_GEMM(fn, bwd_dW1_xT_dact, ExpertProduct::kDW1);  \
  PARM_EXPERT_GEMM(fn, bwd_dx_dact_W1T, ExpertProduct::kDX)
PARM_EXPERT_GEMMS(BM_ExpertGemm);
PARM_EXPERT_GEMMS(BM_ExpertGemmOnednnBf16);
#undef PARM_EXPERT_GEMM
// bf16 also at R = kR + 1 rows: the layer's row counts are rarely a multiple of 16 (2052 rows
// over 4 experts on the reference layer's busiest rank), so the products there have a partial
// row tile (pre, out, dact, dx) or a zero-padded last k step (dW1, dW2).
#define PARM_EXPERT_GEMM(fn, row_name, product) \
  BENCHMARK_CAPTURE(fn, row_name, product)       \
      ->ArgNames({"H", "R"})                     \
      ->Args({kH, kR})                           \
      ->Args({kH / 2, kR})                       \
      ->Args({kH, kR + 1})                       \
      ->UseRealTime()                            \
      ->MinTime(0.2)
PARM_EXPERT_GEMMS(BM_ExpertGemmBf16);
#undef PARM_EXPERT_GEMMS
#undef PARM_EXPERT_GEMM

// ---- Memory-bound kernels --------------------------------------------------------------

// Reads x (rows, cols); writes idx (int32) and val (fp32), both (rows, k).
void BM_TopK(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int k = static_cast<int>(state.range(2));
  const std::vector<float> x = random_vector(rows * cols, 5);
  std::vector<int32_t> idx(rows * k);
  std::vector<float> val(rows * k);
  for (auto _ : state) {
    parm::cpu::topk(x.data(), rows, cols, k, idx.data(), val.data());
    benchmark::DoNotOptimize(idx.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * (rows * cols + 2 * rows * k));
}
BENCHMARK(BM_TopK)
    ->ArgNames({"rows", "cols", "k"})
    ->Args({1024, 8, 2})  // the gate at the reference MoE configuration: T = 1024, E = 8, k = 2
    ->Args({2048, 8, 2})
    ->Args({1024, 64, 8})   // fine-grained experts (issue 36): E = 64, k = 8
    ->Args({1024, 256, 8})
    ->UseRealTime()
    ->MinTime(0.2);

void BM_Softmax(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const std::vector<float> x = random_vector(rows * cols, 6);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    parm::cpu::softmax_forward(x.data(), y.data(), rows, cols);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 2 * rows * cols);
}
BENCHMARK(BM_Softmax)
    ->ArgNames({"rows", "cols"})
    ->Args({1024, 8})  // the gate at the reference MoE configuration: T = 1024, E = 8
    ->Args({2048, 8})
    ->Args({2048, 2048})
    ->UseRealTime()
    ->MinTime(0.2);

void BM_SoftmaxBackward(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const std::vector<float> y = random_vector(rows * cols, 7), dy = random_vector(rows * cols, 8);
  std::vector<float> dx(y.size());
  for (auto _ : state) {
    parm::cpu::softmax_backward(y.data(), dy.data(), dx.data(), rows, cols);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * rows * cols);
}
BENCHMARK(BM_SoftmaxBackward)
    ->ArgNames({"rows", "cols"})
    ->Args({1024, 8})
    ->Args({2048, 8})
    ->UseRealTime()
    ->MinTime(0.2);

// Fused bias + GeLU over the expert hidden activations: reads pre and bias, writes pre and act.
void BM_BiasGeluForward(benchmark::State& state) {
  const int64_t rows = 2048, cols = 2048;
  const std::vector<float> x = random_vector(rows * cols, 9), bias = random_vector(cols, 10);
  std::vector<float> pre = x, act(x.size());
  for (auto _ : state) {
    parm::cpu::bias_gelu_forward(pre.data(), bias.data(), act.data(), rows, cols);
    benchmark::DoNotOptimize(act.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * rows * cols);
}
BENCHMARK(BM_BiasGeluForward)->UseRealTime()->MinTime(0.2);

void BM_GeluBackward(benchmark::State& state) {
  const int64_t n = 2048 * 2048;
  const std::vector<float> x = random_vector(n, 11), dy = random_vector(n, 12);
  std::vector<float> dx(x.size());
  for (auto _ : state) {
    parm::cpu::gelu_backward(x.data(), dy.data(), dx.data(), n);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * n);
}
BENCHMARK(BM_GeluBackward)->UseRealTime()->MinTime(0.2);

// The experts' activation: act = gelu(x + b1) with x kept, and its one-pass adjoint that
// reads x and dact, writes dx and accumulates db1 (cols).
void BM_BiasGelu(benchmark::State& state) {
  const int64_t rows = 2048, cols = 2048, n = rows * cols;
  const std::vector<float> x = random_vector(n, 13), bias = random_vector(cols, 15);
  std::vector<float> act(x.size());
  for (auto _ : state) {
    parm::cpu::bias_gelu(x.data(), bias.data(), act.data(), rows, cols);
    benchmark::DoNotOptimize(act.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 2 * n);
}
BENCHMARK(BM_BiasGelu)->UseRealTime()->MinTime(0.2);

void BM_BiasGeluBackward(benchmark::State& state) {
  const int64_t rows = 2048, cols = 2048, n = rows * cols;
  const std::vector<float> x = random_vector(n, 13), dact = random_vector(n, 14);
  const std::vector<float> bias = random_vector(cols, 15);
  std::vector<float> dx(x.size()), dbias(static_cast<size_t>(cols), 0.0f);
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(dact.begin(), dact.end(), dx.begin());
    state.ResumeTiming();
    // In place, as the layer calls it.
    parm::cpu::bias_gelu_backward(x.data(), bias.data(), dx.data(), dx.data(), dbias.data(),
                                  rows, cols);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * n);
}
BENCHMARK(BM_BiasGeluBackward)->UseRealTime()->MinTime(0.2);

// The gated experts' act = silu(a) g and its adjoint, over one expert's block of rows as the
// layer runs them (rows 256, H 1024: 1 MiB per operand).
void BM_SwigluForward(benchmark::State& state) {
  const int64_t n = 256 * 1024;
  const std::vector<float> a = random_vector(n, 16), g = random_vector(n, 17);
  std::vector<float> act(a.size());
  for (auto _ : state) {
    parm::cpu::swiglu_forward(a.data(), g.data(), act.data(), n);
    benchmark::DoNotOptimize(act.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * n);
}
BENCHMARK(BM_SwigluForward)->UseRealTime()->MinTime(0.2);

void BM_SwigluBackward(benchmark::State& state) {
  const int64_t n = 256 * 1024;
  const std::vector<float> a = random_vector(n, 16), g = random_vector(n, 17);
  const std::vector<float> dact = random_vector(n, 18);
  std::vector<float> da(a.size()), dg(a.size());
  for (auto _ : state) {
    parm::cpu::swiglu_backward(a.data(), g.data(), dact.data(), da.data(), dg.data(), n);
    benchmark::DoNotOptimize(da.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 5 * n);
}
BENCHMARK(BM_SwigluBackward)->UseRealTime()->MinTime(0.2);

// The experts' GeLU steps over one expert's 513 rows (Hl 2048; pre and dact 4 MiB, out of
// L2), 32 rows at a time as Bf16ExpertProducts runs them, with every packing they feed.
// steps = 0: the previous steps (bias + GeLU packing act as A from registers, then act^T from
// an fp32 block; backward: gelu' recomputed from pre, dpre as A from registers, then as B
// rows from an fp32 block); steps = 1: the one-pass kernels (act and act^T from registers,
// gelu' over pre; backward: dpre = gelu' dact into A and B from registers). value_time is
// the time per value.
constexpr int64_t kGeluRows = 513;
std::vector<uint16_t> packed_a(int64_t m, int64_t k) {
  return std::vector<uint16_t>(static_cast<size_t>(parm::cpu::bf16_packed_a_size(m, k)));
}
void set_value_time(benchmark::State& state, int64_t values) {
  state.counters["value_time"] = benchmark::Counter(
      static_cast<double>(values), benchmark::Counter::kIsIterationInvariantRate |
                                       benchmark::Counter::kInvert);
}
void BM_ExpertGeluForwardBf16(benchmark::State& state) {
  const int64_t rows = kGeluRows, cols = kH;
  const std::vector<float> pre = random_vector(rows * cols, 41), bias = random_vector(cols, 42);
  std::vector<float> block(static_cast<size_t>(parm::cpu::gelu_pack_scratch_size(cols)));
  auto a = packed_a(rows, cols), at = packed_a(cols, rows);
  std::vector<float> x = pre;  // the new step overwrites it with gelu'
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(pre.begin(), pre.end(), x.begin());
    state.ResumeTiming();
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
      const int64_t nr = std::min<int64_t>(32, rows - r0);
      uint16_t* a_block = a.data() + parm::cpu::bf16_packed_a_size(r0, cols);
      if (state.range(0) == 0) {
        parm::cpu::bias_gelu_pack_a_bf16(pre.data() + r0 * cols, bias.data(), block.data(), nr,
                                         cols, a_block);
        parm::cpu::bf16_pack_at_rows(r0, nr, cols, rows, block.data(), cols, at.data());
      } else {
        parm::cpu::bias_gelu_pack_both_bf16(x.data() + r0 * cols, bias.data(), r0, nr, rows,
                                            cols, a_block, at.data(), block.data());
      }
    }
    benchmark::DoNotOptimize(at.data());
    benchmark::ClobberMemory();
  }
  set_value_time(state, rows * cols);
}
BENCHMARK(BM_ExpertGeluForwardBf16)->ArgName("steps")->Arg(0)->Arg(1)->UseRealTime()->MinTime(0.2);
void BM_ExpertGeluBackwardBf16(benchmark::State& state) {
  const int64_t rows = kGeluRows, cols = kH;
  const std::vector<float> pre = random_vector(rows * cols, 41), bias = random_vector(cols, 42);
  const std::vector<float> dact = random_vector(rows * cols, 43);
  std::vector<float> block(static_cast<size_t>(parm::cpu::gelu_pack_scratch_size(cols))),
      dbias(static_cast<size_t>(cols));
  auto a = packed_a(rows, cols), at = packed_a(cols, rows);
  std::vector<uint16_t> b(static_cast<size_t>(parm::cpu::bf16_packed_b_size(rows, cols)));
  std::vector<float> grad = pre;
  for (int64_t r0 = 0; r0 < rows; r0 += 32)  // gelu' as the forward pass leaves it
    parm::cpu::bias_gelu_pack_both_bf16(grad.data() + r0 * cols, bias.data(), r0,
                                        std::min<int64_t>(32, rows - r0), rows, cols,
                                        a.data() + parm::cpu::bf16_packed_a_size(r0, cols),
                                        at.data(), block.data());
  for (auto _ : state) {
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
      const int64_t nr = std::min<int64_t>(32, rows - r0);
      uint16_t* a_block = a.data() + parm::cpu::bf16_packed_a_size(r0, cols);
      if (state.range(0) == 0) {
        parm::cpu::bias_gelu_backward_pack_a_bf16(pre.data() + r0 * cols, bias.data(),
                                                  dact.data() + r0 * cols, block.data(),
                                                  dbias.data(), nr, cols, a_block);
        parm::cpu::bf16_pack_b_rows(r0, nr, rows, cols, block.data(), cols, b.data());
      } else {
        parm::cpu::gelu_grad_pack_both_bf16(grad.data() + r0 * cols, dact.data() + r0 * cols,
                                            dbias.data(), r0, nr, rows, cols, a_block, b.data(),
                                            block.data());
      }
    }
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  set_value_time(state, rows * cols);
}
BENCHMARK(BM_ExpertGeluBackwardBf16)->ArgName("steps")->Arg(0)->Arg(1)->UseRealTime()->MinTime(0.2);

void BM_LayerNorm(benchmark::State& state) {
  const int64_t rows = 2048, cols = 512;
  const std::vector<float> x = random_vector(rows * cols, 13), gamma = random_vector(cols, 14),
                           beta = random_vector(cols, 15);
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  for (auto _ : state) {
    parm::cpu::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                 rstd.data(), rows, cols, 1e-5f);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 2 * rows * cols);
}
BENCHMARK(BM_LayerNorm)->UseRealTime()->MinTime(0.2);

// Dispatch-like gather: 2048 rows of 512 from a permutation (some slots empty).
std::vector<int64_t> permuted_rows(int64_t n, uint64_t stream) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  parm::Rng rng(kSeed, stream);
  for (int64_t i = n - 1; i > 0; --i) std::swap(idx[i], idx[rng.next_u32() % (i + 1)]);
  return idx;
}

void BM_GatherRows(benchmark::State& state) {
  const int64_t rows = 2048, cols = 512;
  const std::vector<float> src = random_vector(rows * cols, 16);
  const std::vector<int64_t> idx = permuted_rows(rows, 17);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    parm::cpu::gather_rows(src.data(), cols, idx.data(), rows, dst.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 2 * rows * cols);
}
BENCHMARK(BM_GatherRows)->UseRealTime()->MinTime(0.2);

// Combine-like scatter-add with weights: reads src, reads and writes dst.
void BM_ScatterAddRows(benchmark::State& state) {
  const int64_t rows = 2048, cols = 512;
  const std::vector<float> src = random_vector(rows * cols, 18), scale = random_vector(rows, 19);
  const std::vector<int64_t> idx = permuted_rows(rows, 20);
  std::vector<float> dst(src.size(), 0.0f);
  for (auto _ : state) {
    parm::cpu::scatter_add_rows(src.data(), cols, idx.data(), scale.data(), rows, dst.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_byte_counters(state, 4.0 * 3 * rows * cols);
}
BENCHMARK(BM_ScatterAddRows)->UseRealTime()->MinTime(0.2);

// ---- Dispatch and combine (moe_ops.h) at the reference MoE configuration ----------------
// T = 1024 tokens, M = 512, E = 8, k = 2, C = ceil(k * 1.2 * T / E) = 308 slots per expert
// (slots = C). The routing comes from gate_forward on random tokens and a random gate weight,
// so the drops and the fill per expert are those of a real gate call.
//
// Bytes counted, from the routing and the functions' contracts (moe_ops.h), not from how they
// are implemented today (which may zero a buffer and then overwrite part of it, or touch a
// row once per choice). With K the kept choices (row >= 0), Tk the tokens with at least one
// kept choice, B = E * slots the buffer rows, T the tokens, and 4 M bytes per row:
//   - every row an output contract defines is written once (a kept copy or a zero row alike);
//   - an accumulated (+=) row is read and written once;
//   - a source row is read once however many kept choices use it;
//   - the per-choice scalars (row index, weight, dweight: 12-16 bytes against 2 KiB rows,
//     under 1%) are left out.
// So dispatch_forward = Tk + B rows, dispatch_backward = K + 2 Tk, combine_forward = K + T,
// combine_backward = Tk + K + B. The working sets (2-5 MiB per tensor) may sit in the
// last-level cache, so of_mem_bw can exceed 1.
constexpr int64_t kT = 1024, kE = 8;
constexpr int kTopK = 2;

struct RoutedBatch {
  parm::Tensor x;  // (T, M)
  parm::moe::GateRouting routing;
  int64_t kept_choices = 0;  // K
  int64_t kept_tokens = 0;   // Tk
  int64_t buffer_rows = 0;   // B = E * slots
};

parm::Tensor random_tensor(parm::Shape shape, uint64_t stream, float scale = 1.0f) {
  parm::Tensor t(std::move(shape));
  parm::Rng rng(kSeed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = scale * rng.normal();
  return t;
}

RoutedBatch make_routed_batch() {
  RoutedBatch b;
  b.x = random_tensor({kT, kM}, 30);
  // Scaled so that the logits have unit variance: a spread of gate probabilities, not one-hot.
  const parm::Tensor wg = random_tensor({kM, kE}, 31, 1.0f / std::sqrt(static_cast<float>(kM)));
  const int64_t c = parm::capacity(kTopK, parm::CapacityFactor{12, 10}, kT, kE);
  parm::Tensor probs({kT, kE});
  std::vector<float> stats(2 * kE);
  parm::moe::gate_forward(b.x, wg, kTopK, c, c, probs, b.routing, stats.data());
  const parm::moe::GateRouting& r = b.routing;
  for (int64_t t = 0; t < r.tokens; ++t) {
    int kept = 0;
    for (int j = 0; j < r.topk; ++j) kept += r.row[static_cast<size_t>(t * r.topk + j)] >= 0;
    b.kept_choices += kept;
    b.kept_tokens += kept > 0;
  }
  b.buffer_rows = r.experts * r.slots;
  return b;
}

// Sets bytes/s from `rows_counted` rows of M floats per call, and a label with the routing
// they were counted from.
void set_routing_counters(benchmark::State& state, const RoutedBatch& b, int64_t rows_counted) {
  set_byte_counters(state, 4.0 * kM * static_cast<double>(rows_counted));
  const parm::moe::GateRouting& r = b.routing;
  state.SetLabel(fmt::format("T={} M={} E={} k={} C={}: kept {}/{} choices, {}/{} tokens; {} rows",
                             r.tokens, kM, r.experts, r.topk, r.capacity, b.kept_choices,
                             r.tokens * r.topk, b.kept_tokens, r.tokens, rows_counted));
}

// buf (B, M) = x rows at kept rows, zero elsewhere: reads Tk rows, writes B rows.
void BM_DispatchForward(benchmark::State& state) {
  const RoutedBatch b = make_routed_batch();
  parm::Tensor buf({b.buffer_rows, kM});
  for (auto _ : state) {
    parm::moe::dispatch_forward(b.x, b.routing, buf);
    benchmark::DoNotOptimize(buf.data());
    benchmark::ClobberMemory();
  }
  set_routing_counters(state, b, b.kept_tokens + b.buffer_rows);
}
BENCHMARK(BM_DispatchForward)->UseRealTime()->MinTime(0.2);

// dx (T, M) += dbuf kept rows: reads K rows, reads and writes Tk rows.
void BM_DispatchBackward(benchmark::State& state) {
  const RoutedBatch b = make_routed_batch();
  const parm::Tensor dbuf = random_tensor({b.buffer_rows, kM}, 32);
  parm::Tensor dx({kT, kM});
  for (auto _ : state) {
    parm::moe::dispatch_backward(dbuf, b.routing, dx);
    benchmark::DoNotOptimize(dx.data());
    benchmark::ClobberMemory();
  }
  set_routing_counters(state, b, b.kept_choices + 2 * b.kept_tokens);
}
BENCHMARK(BM_DispatchBackward)->UseRealTime()->MinTime(0.2);

// out (T, M) = weighted sum of kept buf rows: reads K rows, writes T rows.
void BM_CombineForward(benchmark::State& state) {
  const RoutedBatch b = make_routed_batch();
  const parm::Tensor buf = random_tensor({b.buffer_rows, kM}, 33);
  parm::Tensor out({kT, kM});
  for (auto _ : state) {
    parm::moe::combine_forward(buf, b.routing, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_routing_counters(state, b, b.kept_choices + kT);
}
BENCHMARK(BM_CombineForward)->UseRealTime()->MinTime(0.2);

// dbuf (B, M) = weight * dout at kept rows, zero elsewhere; dweight = <dout, buf row>: reads
// Tk dout rows and K buf rows, writes B rows.
void BM_CombineBackward(benchmark::State& state) {
  const RoutedBatch b = make_routed_batch();
  const parm::Tensor buf = random_tensor({b.buffer_rows, kM}, 34);
  const parm::Tensor dout = random_tensor({kT, kM}, 35);
  parm::Tensor dbuf({b.buffer_rows, kM});
  std::vector<float> dweight;
  for (auto _ : state) {
    parm::moe::combine_backward(buf, dout, b.routing, dbuf, dweight);
    benchmark::DoNotOptimize(dbuf.data());
    benchmark::DoNotOptimize(dweight.data());
    benchmark::ClobberMemory();
  }
  set_routing_counters(state, b, b.kept_tokens + b.kept_choices + b.buffer_rows);
}
BENCHMARK(BM_CombineBackward)->UseRealTime()->MinTime(0.2);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  g_ceilings.gemm_flops = measure_gemm_peak();
  g_ceilings.bf16_flops = measure_bf16_peak();
  g_ceilings.mem_bytes = measure_memory_bandwidth();
  const std::string peak = fmt::format("{:.1f} GFLOP/s (best 1024^3 GEMM, {} thread(s))",
                                       g_ceilings.gemm_flops * 1e-9, parm::cpu::gemm_threads());
  const std::string bw = fmt::format(
      "{:.1f} GB/s (best of a 3 x 64 MiB triad and a 128 MiB memcpy)", g_ceilings.mem_bytes * 1e-9);
  fmt::print("GEMM backend: {}\nceiling gemm_peak: {}\nceiling mem_bw:    {}\n",
             parm::cpu::gemm_backend(), peak, bw);
  benchmark::AddCustomContext("gemm_backend", parm::cpu::gemm_backend());
  benchmark::AddCustomContext("ceiling_gemm_peak", peak);
  benchmark::AddCustomContext("ceiling_mem_bw", bw);
  const std::string bf16_peak =
      fmt::format("{:.1f} GFLOP/s (best 1024^3 bf16 GEMM on packed operands; {}; cpu {})",
                  g_ceilings.bf16_flops / 1e9, parm::cpu::bf16_kernel_name(),
                  parm::cpu::cpu_bf16_capability());
  fmt::print("ceiling bf16_peak: {}\n", bf16_peak);
  benchmark::AddCustomContext("ceiling_bf16_peak", bf16_peak);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
