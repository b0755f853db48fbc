// The matrix products of one expert shard over R filled rows (model dim M, hidden Hl), as
// the layer calls them. They are the layer's floor: `bench-layer` times these same calls
// alone, at the shapes of the last forward pass, to get the GEMM rate they reach.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "moe/bf16_weight_copies.h"
#include "moe/phase_times.h"
#include "parm/device.h"
#include "shape/expert_mlp.h"

namespace parm::moe {

// The GEMM path of every product in the layer (gate and experts): dnnl_sgemm allocates
// nothing per call and takes any row count without a new primitive; on the experts' shapes
// with an uneven row count it matched or beat the matmul primitive here (the gate's tiny
// (T, E) products are up to 1.5x slower on it: under 0.1 ms per layer at T = 1024).
constexpr cpu::GemmPath kLayerGemm = cpu::GemmPath::kSgemm;

// The products, and the GEMM call of each for one expert over `rows` rows: six for a gelu
// expert, nine for a swiglu one (its gate projection W3 adds one forward and two backward
// products of W1's shapes). The layer's functions below, the floor and the kernel benchmarks
// all take them from here.
enum class ExpertProduct {
  kPre,     // pre (R, Hl) = x (R, M) W1 (M, Hl)
  kOut,     // out (R, M) = act (R, Hl) W2 (Hl, M)
  kDW2,     // dW2 (Hl, M) += act^T (Hl, R) dy (R, M)
  kDAct,    // dact (R, Hl) = dy (R, M) W2^T (M, Hl)
  kDW1,     // dW1 (M, Hl) += x^T (M, R) dpre (R, Hl)
  kDX,      // dx (R, M) = dpre (R, Hl) W1^T (Hl, M)
  kGate,    // swiglu: gate (R, Hl) = x (R, M) W3 (M, Hl)
  kDW3,     // swiglu: dW3 (M, Hl) += x^T (M, R) dgate (R, Hl)
  kDXGate,  // swiglu: dx (R, M) += dgate (R, Hl) W3^T (Hl, M)
};
constexpr int kMaxExpertProducts = 9;
// gelu's six, in the pass's order.
constexpr ExpertProduct kExpertProducts[] = {ExpertProduct::kPre, ExpertProduct::kOut,
                                             ExpertProduct::kDW2, ExpertProduct::kDAct,
                                             ExpertProduct::kDW1, ExpertProduct::kDX};
// swiglu's nine, in the pass's order.
constexpr ExpertProduct kSwigluExpertProducts[] = {
    ExpertProduct::kPre,  ExpertProduct::kGate, ExpertProduct::kOut,
    ExpertProduct::kDW2,  ExpertProduct::kDAct, ExpertProduct::kDW1,
    ExpertProduct::kDX,   ExpertProduct::kDW3,  ExpertProduct::kDXGate};
// The products of an expert of kind `mlp`.
std::span<const ExpertProduct> expert_products(ExpertMlp mlp);
struct GemmCall {
  bool trans_a = false, trans_b = false, accumulate = false;
  int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};
GemmCall expert_gemm(ExpertProduct p, int64_t rows, int64_t model_dim, int64_t hidden);
// Runs product p on contiguous operands (a and b in the order of the comments above; c the
// output) through the layer's GEMM path.
void run_expert_gemm(ExpertProduct p, int64_t rows, int64_t model_dim, int64_t hidden,
                     const float* a, const float* b, float* c);

// pre (R, Hl) = x (R, M) W1 (M, Hl). Overwrites pre.
void fc1_forward(int64_t rows, int64_t model_dim, int64_t hidden, const float* x, const float* w1,
                 float* pre);
// out (R, M) = act (R, Hl) W2 (Hl, M). Overwrites out.
void fc2_forward(int64_t rows, int64_t model_dim, int64_t hidden, const float* act,
                 const float* w2, float* out);
// dW2 (Hl, M) += act^T dy; dact (R, Hl) = dy (R, M) W2^T. Accumulates dw2, overwrites dact.
void fc2_backward(int64_t rows, int64_t model_dim, int64_t hidden, const float* act,
                  const float* dy, const float* w2, float* dw2, float* dact);
// dW1 (M, Hl) += x^T dpre; dx (R, M) = dpre (R, Hl) W1^T. Accumulates dw1, overwrites dx.
void fc1_backward(int64_t rows, int64_t model_dim, int64_t hidden, const float* x,
                  const float* dpre, const float* w1, float* dw1, float* dx);

// One expert's rows where a layout holds them: `runs` runs of rows, run s being the first
// counts[s * count_stride] rows at base + s * run_stride, or at row starts[s * count_stride] of
// base when starts is given (a packed layout; row-major, `cols` values a row), read in run
// order. counts == nullptr: one run of `runs` rows at base (contiguous()).
struct RowRuns {
  const float* base = nullptr;
  int64_t cols = 0;
  int64_t runs = 0;
  int64_t run_stride = 0;
  const int32_t* counts = nullptr;
  int64_t count_stride = 1;
  const int64_t* starts = nullptr;
  static RowRuns contiguous(const float* x, int64_t rows, int64_t cols) {
    return {x, cols, rows, 0, nullptr, 1, nullptr};
  }
  // Copies rows r0 .. r0 + n - 1 (numbered over all runs in order) to dst (n, cols).
  void copy(int64_t r0, int64_t n, float* dst) const;
};

// The six products (swiglu's nine) at Precision::kBf16 (bf16 operands, fp32 accumulation and
// outputs, as the CUDA path), every operand rounded into the packed layouts of
// cpu::gemm_bf16_packed, which runs the CPU's bf16 kernel (AMX, AVX512-BF16, or on a CPU
// without bf16 units the fp32 GEMM over the widened bf16 operands: kernels.h Bf16Kernel).
// pack_weights packs every expert's W1, W2 and W1^T, W2^T (swiglu: W3 and W3^T too) before
// the forward products when
// they are stale (moe/bf16_weight_copies.h: other tensors, another version given to
// set_weights_version, or no version given: every forward call); the products of later passes
// at the same version, backward ones among them, reuse them. An expert's forward pass keeps x^T
// and act^T packed (half the bytes of fp32 copies; act and dpre are never written in fp32)
// and gelu'(pre + b1) in fp32 over pre for its backward pass; the GeLU steps run 32 rows at
// a time with the bf16 GeLU and round every output into its packed layouts from registers
// (cpu::bias_gelu_pack_both_bf16, gelu_grad_pack_both_bf16); the row operands x and dy are
// read where the exchange layout holds them (RowRuns) a block at a time and packed twice
// from cache, with no fp32 copy of the rows. Swiglu experts (reserve's `gated`) keep pre and
// gate (x W3) in fp32 for their backward pass; SiLU(pre) * gate runs in fp32 (cpu::swiglu_*)
// 32 rows at a time and is rounded into act's packed layouts from cache; their backward pass
// writes dpre and dgate in fp32 and packs each twice. Nothing is allocated after reserve().
class Bf16ExpertProducts {
 public:
  void reserve(int64_t experts, int64_t max_rows, int64_t model_dim, int64_t hidden,
               bool gated = false);
  // w1 (E_loc, M, Hl), w2 (E_loc, Hl, M), fp32, and w3 (E_loc, M, Hl) for swiglu experts
  // (null for gelu ones): one pass over them writes all their layouts, unless the packed
  // copies already hold these weights at the current version. Returns whether it packed.
  bool pack_weights(const float* w1, const float* w2, const float* w3 = nullptr);
  // The version of the weights the next pack_weights is given (Bf16WeightCopies).
  void set_weights_version(uint64_t v) { copies_.set_version(v); }
  // Times the weights were packed so far, and the wall time of the last packing (us).
  int64_t weight_packs() const { return copies_.copies_made(); }
  double last_pack_us() const { return last_pack_us_; }
  // Each step below laps `clock` (may be null) after its elementwise work and after its
  // products, with the phase names of the fp32 path (experts_forward / experts_backward):
  // reading and packing x or dy "rows in/out" (db2 included), the GeLU steps with their
  // packing "bias + GeLU" / "GeLU + bias backward", the GEMMs alone "expert products".
  // pre (R, Hl) = x (R, M) W1 for expert e, x's R rows read from `x`; keeps x^T packed.
  // Overwrites pre.
  void fc1_forward(int64_t e, int64_t rows, const RowRuns& x, float* pre,
                   PhaseClock* clock = nullptr);
  // act = gelu(pre + b1), out (R, M) = act W2; keeps act^T packed and overwrites pre with
  // gelu'(pre + b1) for the backward pass. Overwrites pre, and out (accumulate: out += act W2).
  void bias_gelu_fc2_forward(int64_t e, int64_t rows, float* pre, const float* b1, float* out,
                             PhaseClock* clock = nullptr, bool accumulate = false);
  // Swiglu (reserve's gated): gate (R, Hl) = x W3 for expert e, x as the fc1_forward just
  // before packed it ("expert products"). Overwrites gate.
  void gate_forward(int64_t e, int64_t rows, float* gate, PhaseClock* clock = nullptr);
  // Swiglu: act = silu(pre) * gate ("SwiGLU"), out (R, M) = act W2; keeps act^T packed; pre
  // and gate are left for the backward pass. Overwrites out (accumulate: out += act W2).
  void swiglu_fc2_forward(int64_t e, int64_t rows, const float* pre, const float* gate,
                          float* out, PhaseClock* clock = nullptr, bool accumulate = false);
  // db2 (M) += column sums of dy (skipped when db2 is null); dW2 (Hl, M) += act^T dy;
  // dact (R, Hl) = dy (R, M) W2^T, dy's R rows read from `dy`. Accumulates db2 and dw2,
  // overwrites dact.
  void fc2_backward(int64_t e, int64_t rows, const RowRuns& dy, float* db2, float* dw2,
                    float* dact, PhaseClock* clock = nullptr);
  // dpre = grad dact (grad (R, Hl): gelu'(pre + b1), what bias_gelu_fc2_forward left in pre),
  // db1 += its column sums, dW1 (M, Hl) += x^T dpre, dx (R, M) = dpre W1^T. Accumulates db1
  // and dw1, overwrites dx.
  void gelu_backward_fc1_backward(int64_t e, int64_t rows, const float* grad, const float* dact,
                                  float* db1, float* dw1, float* dx, PhaseClock* clock = nullptr);
  // Swiglu: dpre = dact gate silu'(pre) (over dact) and dgate (R, Hl) = dact silu(pre)
  // ("SwiGLU backward"); dW1 (M, Hl) += x^T dpre, dW3 (M, Hl) += x^T dgate, dx (R, M) =
  // dpre W1^T + dgate W3^T. Accumulates dw1 and dw3, overwrites dact, dgate and dx.
  void swiglu_backward_fc1_backward(int64_t e, int64_t rows, const float* pre, const float* gate,
                                    float* dact, float* dgate, float* dw1, float* dw3, float* dx,
                                    PhaseClock* clock = nullptr);
  int64_t held_bytes() const;

 private:
  // Rows r0 .. r0 + nr - 1 of t (R, Hl), fp32, as row block r0 of packed A (into `a`) and as
  // rows r0.. of packed B of the whole (R, Hl) operand (into b_).
  void pack_rows_a_b(int64_t r0, int64_t nr, int64_t rows, const float* t, uint16_t* a);
  int64_t experts_ = 0, max_rows_ = 0, model_dim_ = 0, hidden_ = 0;
  bool gated_ = false;
  int64_t w_stride_ = 0;   // values per expert in each packed weight buffer
  int64_t xt_stride_ = 0, at_stride_ = 0;  // values per expert in xt_, at_
  cpu::Bf16Buffer a_, b_;  // packed row operands of the product being run
  cpu::Bf16Buffer a2_;     // a second packed A: dpre, packed beside dpre as B
  // The GeLU steps' scratch (cpu::gelu_pack_scratch_size(Hl) floats): act's bf16 pairs
  // staged for act^T's transpose, or without AVX512-BF16 act or dpre of one block in fp32
  std::vector<float> block_;
  std::vector<float> rows_;      // (kFuseRows, M) fp32: x or dy of one block of rows
  // Per expert, packed as B: W1 (M, Hl) and W2 (Hl, M) for the forward pass, W2^T (M, Hl)
  // and W1^T (Hl, M) for the backward pass; packed as A from the forward pass: x^T (M, R),
  // act^T (Hl, R).
  cpu::Bf16Buffer w1_, w2_, w2t_, w1t_, xt_, at_;
  cpu::Bf16Buffer w3_, w3t_;  // swiglu: W3 (M, Hl) and W3^T (Hl, M) packed as B
  std::vector<float> act_rows_;  // swiglu: (kFuseRows, Hl) fp32, act of one block of rows
  Bf16WeightCopies copies_;  // what w1_, w2_, w2t_, w1t_ hold
  double last_pack_us_ = 0;
};

// FLOPs of the products (forward and backward) of one expert over `rows` rows.
double expert_product_flops(int64_t rows, int64_t model_dim, int64_t hidden,
                            ExpertMlp mlp = ExpertMlp::kGelu);

// The floor of a forward + backward pass: the products of every expert (rows[e] rows each),
// each on its own operands, run alone `reps` times; returns the median total (us). At bf16
// the operands are packed before the clock starts: the floor is the bf16 GEMMs alone.
// Allocates its operands on every call (moe/expert_floor.h: ExpertProductsFloor).
double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim,
                               int64_t hidden, int reps, Precision p = Precision::kFp32,
                               ExpertMlp mlp = ExpertMlp::kGelu);

}  // namespace parm::moe
