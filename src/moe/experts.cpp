// The local experts (ESP shards) over the exchange layout (blocks, E_loc, slots, M), computed
// on the filled rows only: expert e's rows in block b are the first fills[b * E_loc + e]
// slots of segment [b, e] (GShard fills slots in order), so empty slots cost nothing.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "moe/expert_products.h"
#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe {
namespace {

// The exchange layout: segments [b, e] of `slots` rows, or packed at rows first[b * e_loc + e].
struct SegmentLayout {
  int64_t e_loc, slots, M;
  const int64_t* first;  // null: segment i at row i * slots
  // Offset of segment [b, e]'s first row (elements).
  int64_t segment(int64_t b, int64_t e) const {
    const int64_t i = b * e_loc + e;
    return (first != nullptr ? first[i] : i * slots) * M;
  }
};

// Copies expert e's filled rows out of the layout into `rows` (n, M), n = their total.
int64_t gather_filled(const Tensor& layout, const SegmentLayout& l, int64_t blocks, int64_t e,
                      const int32_t* fills, float* rows) {
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t f = fills[b * l.e_loc + e];
    std::memcpy(rows + n * l.M, layout.data() + l.segment(b, e),
                static_cast<size_t>(f * l.M) * sizeof(float));
    n += f;
  }
  return n;
}

// Expert e's filled rows over all blocks.
int64_t filled_rows(const int32_t* fills, int64_t blocks, int64_t e_loc, int64_t e) {
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) n += fills[b * e_loc + e];
  return n;
}

// The reverse: filled rows back into the layout; the empty slots after them are zeroed (the
// packed layout has none).
// A large layout is written past the cache (the exchange after the experts reads it; the
// caller fences once all experts are scattered).
void scatter_filled(const float* rows, const SegmentLayout& l, int64_t blocks, int64_t e,
                    const int32_t* fills, Tensor& layout) {
  const int64_t M = l.M;
  const bool stream = cpu::streamed(layout.bytes());
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t f = fills[b * l.e_loc + e];
    float* seg = layout.data() + l.segment(b, e);
    if (stream)
      cpu::copy_stream(seg, rows + n * M, f * M);
    else
      std::memcpy(seg, rows + n * M, static_cast<size_t>(f * M) * sizeof(float));
    if (l.first == nullptr)
      std::memset(seg + f * M, 0, static_cast<size_t>((l.slots - f) * M) * sizeof(float));
    n += f;
  }
}

// Expert e's filled rows where the layout holds them (segment [b, e] for every block b).
RowRuns filled_runs(const Tensor& layout, const SegmentLayout& l, int64_t blocks, int64_t e,
                    const int32_t* fills) {
  if (l.first != nullptr) return {layout.data(), l.M, blocks, 0, fills + e, l.e_loc, l.first + e};
  return {layout.data() + l.segment(0, e), l.M, blocks, l.e_loc * l.slots * l.M, fills + e,
          l.e_loc, nullptr};
}

void check_fills(const int32_t* fills, int64_t blocks, int64_t e_loc, int64_t slots) {
  for (int64_t i = 0; i < blocks * e_loc; ++i)
    PARM_CHECK(fills[i] >= 0 && fills[i] <= slots,
               "expert segment {} has fill count {}, outside [0, {}] (corrupt routing counts)",
               i, fills[i], slots);
}

// Checks that in / out hold the layout: (blocks, E_loc, slots, M), or packed, the routed rows.
void check_buffers(const char* what, const Tensor& a, const Tensor& b, const SegmentLayout& l,
                   int64_t blocks, const int32_t* fills) {
  const int64_t segs = blocks * l.e_loc;
  const int64_t need = l.first == nullptr ? segs * l.slots * l.M
                       : segs == 0        ? 0
                                          : (l.first[segs - 1] + fills[segs - 1]) * l.M;
  PARM_CHECK((l.first == nullptr ? a.numel() == need : a.numel() >= need) &&
                 b.numel() == a.numel(),
             "{} {} / {} for blocks={} E_loc={} slots={} M={}{}: {} elements needed", what,
             shape_str(a.shape()), shape_str(b.shape()), blocks, l.e_loc, l.slots, l.M,
             l.first != nullptr ? " (packed)" : "", need);
}

// The weights' kind and the workspace's agree (gate rows are reserved for swiglu only).
void check_kind(const ExpertShards& w, const ExpertWorkspace& ws) {
  PARM_CHECK(w.gated() == is_gated(ws.mlp),
             "expert weights {} W3 but the expert workspace is reserved for {} experts",
             w.gated() ? "with" : "without", expert_mlp_name(ws.mlp));
}

}  // namespace

void ffn_forward(int64_t n, int64_t M, int64_t hl, const float* x, const ExpertShards& w,
                 int64_t e, float* pre, float* gate, float* act, float* out, bool accumulate,
                 PhaseClock& clock) {
  const int64_t wi = e * M * hl;
  run_expert_gemm(ExpertProduct::kPre, n, M, hl, x, w.w1.data() + wi, pre);
  if (w.gated()) {  // swiglu: act = silu(x W1) * (x W3)
    run_expert_gemm(ExpertProduct::kGate, n, M, hl, x, w.w3.data() + wi, gate);
    clock.lap("expert products");
    cpu::swiglu_forward(pre, gate, act, n * hl);
    clock.lap("SwiGLU");
  } else {  // act = gelu(x W1 + b1); pre keeps x W1 (the backward adds b1 again)
    clock.lap("expert products");
    cpu::bias_gelu(pre, w.b1.data() + e * hl, act, n, hl);
    clock.lap("bias + GeLU");
  }
  const GemmCall g = expert_gemm(ExpertProduct::kOut, n, M, hl);
  cpu::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, act, w.w2.data() + e * hl * M, out,
            accumulate, kLayerGemm);
  clock.lap("expert products");
}

void ffn_backward(int64_t n, int64_t M, int64_t hl, const float* x, const float* dy,
                  const ExpertShards& w, int64_t e, const float* pre, const float* gate,
                  const float* act, ExpertShards& dw, float* dact, float* dgate, float* dx,
                  PhaseClock& clock) {
  const int64_t wi = e * M * hl, w2i = e * hl * M;
  // dW2 += act^T dy, dact = dy W2^T.
  fc2_backward(n, M, hl, act, dy, w.w2.data() + w2i, dw.w2.data() + w2i, dact);
  clock.lap("expert products");
  if (w.gated()) {  // dpre = dact gate silu'(pre) (over dact), dgate = dact silu(pre)
    cpu::swiglu_backward(pre, gate, dact, dact, dgate, n * hl);
    clock.lap("SwiGLU backward");
  } else {  // dpre = gelu'(pre + b1) dact (over dact), db1 += its column sums
    cpu::bias_gelu_backward(pre, w.b1.data() + e * hl, dact, dact, dw.b1.data() + e * hl, n,
                            hl);
    clock.lap("GeLU + bias backward");
  }
  // dW1 += x^T dpre, dx = dpre W1^T (swiglu: dW3 += x^T dgate, dx += dgate W3^T).
  fc1_backward(n, M, hl, x, dact, w.w1.data() + wi, dw.w1.data() + wi, dx);
  if (w.gated()) {
    run_expert_gemm(ExpertProduct::kDW3, n, M, hl, x, dgate, dw.w3.data() + wi);
    run_expert_gemm(ExpertProduct::kDXGate, n, M, hl, dgate, w.w3.data() + wi, dx);
  }
  clock.lap("expert products");
}

void ExpertWorkspace::reserve(int64_t experts, int64_t max_rows_, int64_t M, int64_t hl,
                              Precision p, int64_t max_total_rows, ExpertMlp mlp_,
                              ActivationPool* pool_) {
  precision = p;
  mlp = mlp_;
  max_rows = max_rows_;
  packed = max_total_rows > 0;
  total_rows = packed ? max_total_rows : max_rows;
  const bool bf16_path = p == Precision::kBf16;
  if (bf16_path) bf16.reserve(experts, max_rows, M, hl, is_gated(mlp_));
  rows.assign(static_cast<size_t>(experts), 0);
  first.assign(static_cast<size_t>(experts), 0);
  in.clear();
  pre.clear();
  act.clear();
  gate.clear();
  const bool gated = is_gated(mlp);
  const int64_t pools = packed ? 1 : experts;
  pool = pool_;
  bound_lane = -1;
  model_dim = M;
  hidden = hl;
  if (pool != nullptr) {  // bind() points the lists at the pool's rows
    const int64_t rows_m = pools * total_rows * M, rows_h = pools * total_rows * hl;
    if (!bf16_path) pool->require(ActivationPool::kIn, rows_m);
    pool->require(ActivationPool::kPre, rows_h);
    if (!bf16_path) pool->require(ActivationPool::kAct, rows_h);
    if (gated) pool->require(ActivationPool::kGate, rows_h);
  }
  for (int64_t e = 0; e < pools && pool == nullptr; ++e) {
    // At bf16 x and act are kept packed (bf16) for the backward pass, and x and dy are
    // packed from the exchange layout itself: neither x nor act is written in fp32. pre
    // holds gelu'(pre + b1) from the forward GeLU step on.
    if (!bf16_path) in.emplace_back(Shape{total_rows, M});
    pre.emplace_back(Shape{total_rows, hl});
    if (!bf16_path) act.emplace_back(Shape{total_rows, hl});
    if (gated) gate.emplace_back(Shape{total_rows, hl});
  }
  out_rows = Tensor({max_rows, M});
  d_out = bf16_path ? Tensor() : Tensor({max_rows, M});
  d_act = Tensor({max_rows, hl});
  d_gate = gated ? Tensor({max_rows, hl}) : Tensor();
}

void ExpertWorkspace::bind() {
  if (pool == nullptr || bound_lane == pool->lane()) return;
  const bool bf16_path = precision == Precision::kBf16, gated = is_gated(mlp);
  const int64_t pools = packed ? 1 : static_cast<int64_t>(rows.size());
  auto views = [&](std::vector<Tensor>& list, ActivationPool::Rows which, int64_t cols) {
    float* base = pool->data(which);
    list.clear();
    for (int64_t e = 0; e < pools; ++e)
      list.push_back(Tensor::view(base + e * total_rows * cols, {total_rows, cols}));
  };
  if (!bf16_path) views(in, ActivationPool::kIn, model_dim);
  views(pre, ActivationPool::kPre, hidden);
  if (!bf16_path) views(act, ActivationPool::kAct, hidden);
  if (gated) views(gate, ActivationPool::kGate, hidden);
  bound_lane = pool->lane();
}

void ExpertWorkspace::place(int64_t e, int64_t n) {
  const auto i = static_cast<size_t>(e);
  first[i] = packed && e > 0 ? first[i - 1] + rows[i - 1] : 0;
  PARM_CHECK(n <= max_rows && first[i] + n <= total_rows,
             "local expert {} gets {} rows after {} rows of the experts before it; the expert "
             "workspace holds {} rows per expert and {} in all (corrupt routing counts)",
             e, n, first[i], max_rows, total_rows);
  rows[i] = n;
}

float* ExpertWorkspace::in_rows(int64_t e) {
  PARM_CHECK(precision != Precision::kBf16, "the bf16 experts keep no fp32 copy of their rows");
  if (packed) return in[0].data() + first[static_cast<size_t>(e)] * in[0].cols();
  return in[static_cast<size_t>(e)].data();
}
float* ExpertWorkspace::pre_rows(int64_t e) {
  if (packed) return pre[0].data() + first[static_cast<size_t>(e)] * pre[0].cols();
  return pre[static_cast<size_t>(e)].data();
}
float* ExpertWorkspace::act_rows(int64_t e) {
  if (packed) return act[0].data() + first[static_cast<size_t>(e)] * act[0].cols();
  return act[static_cast<size_t>(e)].data();
}

float* ExpertWorkspace::gate_rows(int64_t e) {
  PARM_CHECK(!gate.empty(), "the expert workspace holds no gate rows (the experts are {})",
             expert_mlp_name(mlp));
  if (packed) return gate[0].data() + first[static_cast<size_t>(e)] * gate[0].cols();
  return gate[static_cast<size_t>(e)].data();
}

int64_t ExpertWorkspace::held_bytes() const {
  int64_t b = out_rows.bytes() + d_out.bytes() + d_act.bytes() + d_gate.bytes();
  for (const auto* list : {&in, &pre, &act, &gate})
    for (const Tensor& t : *list)
      if (t.owns()) b += t.bytes();  // not the views of a pool (ActivationPool)
  return b;
}

void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                     const int32_t* fills, bool add_b2, ExpertWorkspace& ws, Tensor& out,
                     PhaseTimes* times, const int64_t* first) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  const SegmentLayout lay{e_loc, slots, M, first};
  PARM_CHECK(static_cast<int64_t>(ws.rows.size()) == e_loc && ws.max_rows >= blocks * slots,
             "expert workspace reserved for {} experts x {} rows, needs {} x {}", ws.rows.size(),
             ws.max_rows, e_loc, blocks * slots);
  check_fills(fills, blocks, e_loc, slots);
  check_buffers("expert buffers", in, out, lay, blocks, fills);
  check_kind(w, ws);
  ws.bind();
  PhaseClock clock(times);
  const bool bf16 = ws.precision == Precision::kBf16;
  // All four layouts once per weight version; experts_backward reuses them.
  if (bf16 && ws.bf16.pack_weights(w.w1.data(), w.w2.data(), w.gated() ? w.w3.data() : nullptr))
    clock.lap("bf16 weight packing");
  for (int64_t e = 0; e < e_loc; ++e) {
    ws.place(e, filled_rows(fills, blocks, e_loc, e));
    float* pre = ws.pre_rows(e);
    const int64_t n = ws.rows[static_cast<size_t>(e)];
    if (bf16) {  // reads x where the layout holds it, packing it; GeLU (SwiGLU) packs act
                 // (each step laps the clock: the GEMMs alone are "expert products")
      ws.bf16.fc1_forward(e, n, filled_runs(in, lay, blocks, e, fills), pre, &clock);
      if (w.gated()) {
        ws.bf16.gate_forward(e, n, ws.gate_rows(e), &clock);
        ws.bf16.swiglu_fc2_forward(e, n, pre, ws.gate_rows(e), ws.out_rows.data(), &clock);
      } else {
        ws.bf16.bias_gelu_fc2_forward(e, n, pre, w.b1.data() + e * hl, ws.out_rows.data(),
                                      &clock);
      }
    } else {
      float* x = ws.in_rows(e);
      PARM_CHECK_EQ(gather_filled(in, lay, blocks, e, fills, x), n);
      clock.lap("rows in/out");
      ffn_forward(n, M, hl, x, w, e, pre, w.gated() ? ws.gate_rows(e) : nullptr, ws.act_rows(e),
                  ws.out_rows.data(), false, clock);
    }
    if (add_b2 && !w.gated()) cpu::add_bias(ws.out_rows.data(), w.b2.data() + e * M, n, M);
    clock.lap("bias + GeLU");
    scatter_filled(ws.out_rows.data(), lay, blocks, e, fills, out);
    clock.lap("rows in/out");
  }
  cpu::stream_fence();  // scatter_filled's streaming writes
}

void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                      const int32_t* fills, ExpertWorkspace& ws, ExpertShards& dw, Tensor& din,
                      PhaseTimes* times, const int64_t* first) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  const SegmentLayout lay{e_loc, slots, M, first};
  check_buffers("expert gradient buffers", dout, din, lay, blocks, fills);
  check_kind(w, ws);
  PARM_CHECK(dw.gated() == w.gated(), "expert gradients {} W3 where the weights {}",
             dw.gated() ? "with" : "without", w.gated() ? "have one" : "have none");
  ws.bind();
  PhaseClock clock(times);
  float* dy = ws.d_out.data();
  float* dact = ws.d_act.data();
  const bool bf16 = ws.precision == Precision::kBf16;
  for (int64_t e = 0; e < e_loc; ++e) {
    const float* pre = ws.pre_rows(e);
    const int64_t n = ws.rows[static_cast<size_t>(e)];
    PARM_CHECK_EQ(filled_rows(fills, blocks, e_loc, e), n);
    if (bf16) {  // reads dy where the layout holds it (db2 and its packing); gelu: dpre from
                 // the gelu' the forward pass left in pre; swiglu: from pre and gate (each
                 // step laps the clock, as there)
      ws.bf16.fc2_backward(e, n, filled_runs(dout, lay, blocks, e, fills),
                           w.gated() ? nullptr : dw.b2.data() + e * M, dw.w2.data() + e * hl * M,
                           dact, &clock);
      if (w.gated())
        ws.bf16.swiglu_backward_fc1_backward(e, n, pre, ws.gate_rows(e), dact, ws.d_gate.data(),
                                             dw.w1.data() + e * M * hl, dw.w3.data() + e * M * hl,
                                             ws.out_rows.data(), &clock);
      else
        ws.bf16.gelu_backward_fc1_backward(e, n, pre, dact, dw.b1.data() + e * hl,
                                           dw.w1.data() + e * M * hl, ws.out_rows.data(),
                                           &clock);
    } else {
      PARM_CHECK_EQ(gather_filled(dout, lay, blocks, e, fills, dy), n);
      clock.lap("rows in/out");
      if (!w.gated()) {
        cpu::bias_backward(dy, dw.b2.data() + e * M, n, M);
        clock.lap("GeLU + bias backward");
      }
      ffn_backward(n, M, hl, ws.in_rows(e), dy, w, e, pre, w.gated() ? ws.gate_rows(e) : nullptr,
                   ws.act_rows(e), dw, dact, w.gated() ? ws.d_gate.data() : nullptr,
                   ws.out_rows.data(), clock);
    }
    scatter_filled(ws.out_rows.data(), lay, blocks, e, fills, din);
    clock.lap("rows in/out");
  }
  cpu::stream_fence();
}

}  // namespace parm::moe
