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

// Offset of segment [b, e]'s first row in the exchange layout (elements).
inline int64_t segment(int64_t b, int64_t e_loc, int64_t e, int64_t slots, int64_t M) {
  return ((b * e_loc + e) * slots) * M;
}

// Copies expert e's filled rows out of the layout into `rows` (n, M), n = their total.
int64_t gather_filled(const Tensor& layout, int64_t blocks, int64_t e_loc, int64_t slots,
                      int64_t e, const int32_t* fills, int64_t M, float* rows) {
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t f = fills[b * e_loc + e];
    std::memcpy(rows + n * M, layout.data() + segment(b, e_loc, e, slots, M),
                static_cast<size_t>(f * M) * sizeof(float));
    n += f;
  }
  return n;
}

// The reverse: filled rows back into the layout; the empty slots after them are zeroed.
void scatter_filled(const float* rows, int64_t blocks, int64_t e_loc, int64_t slots, int64_t e,
                    const int32_t* fills, int64_t M, Tensor& layout) {
  int64_t n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t f = fills[b * e_loc + e];
    float* seg = layout.data() + segment(b, e_loc, e, slots, M);
    std::memcpy(seg, rows + n * M, static_cast<size_t>(f * M) * sizeof(float));
    std::memset(seg + f * M, 0, static_cast<size_t>((slots - f) * M) * sizeof(float));
    n += f;
  }
}

void check_fills(const int32_t* fills, int64_t blocks, int64_t e_loc, int64_t slots) {
  for (int64_t i = 0; i < blocks * e_loc; ++i)
    PARM_CHECK(fills[i] >= 0 && fills[i] <= slots,
               "expert segment {} has fill count {}, outside [0, {}] (corrupt routing counts)",
               i, fills[i], slots);
}

}  // namespace

void ExpertWorkspace::reserve(int64_t experts, int64_t max_rows, int64_t M, int64_t hl,
                              Precision p) {
  precision = p;
  const bool bf16_path = p == Precision::kBf16;
  if (bf16_path) bf16.reserve(experts, max_rows, M, hl);
  rows.assign(static_cast<size_t>(experts), 0);
  in.clear();
  pre.clear();
  act.clear();
  for (int64_t e = 0; e < experts; ++e) {
    // At bf16 x and act are kept packed (bf16) for the backward pass: one x serves as the
    // gather scratch of every expert, and act is not written in fp32.
    if (!bf16_path || e == 0) in.emplace_back(Shape{max_rows, M});
    pre.emplace_back(Shape{max_rows, hl});
    if (!bf16_path) act.emplace_back(Shape{max_rows, hl});
  }
  out_rows = Tensor({max_rows, M});
  d_out = Tensor({max_rows, M});
  d_act = Tensor({max_rows, hl});
}

void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                     const int32_t* fills, bool add_b2, ExpertWorkspace& ws, Tensor& out,
                     PhaseTimes* times) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  PARM_CHECK(in.numel() == blocks * e_loc * slots * M && out.numel() == in.numel(),
             "expert buffers {} / {} for blocks={} E_loc={} slots={} M={}",
             shape_str(in.shape()), shape_str(out.shape()), blocks, e_loc, slots, M);
  PARM_CHECK(static_cast<int64_t>(ws.pre.size()) == e_loc && ws.out_rows.rows() >= blocks * slots,
             "expert workspace reserved for {} experts x {} rows, needs {} x {}", ws.pre.size(),
             ws.out_rows.rows(), e_loc, blocks * slots);
  check_fills(fills, blocks, e_loc, slots);
  PhaseClock clock(times);
  const bool bf16 = ws.precision == Precision::kBf16;
  if (bf16) {  // all four layouts once per step; experts_backward reuses them
    ws.bf16.pack_weights(w.w1.data(), w.w2.data());
    clock.lap("expert products");
  }
  for (int64_t e = 0; e < e_loc; ++e) {
    float* x = ws.in[bf16 ? 0 : static_cast<size_t>(e)].data();
    float* pre = ws.pre[static_cast<size_t>(e)].data();
    const int64_t n = gather_filled(in, blocks, e_loc, slots, e, fills, M, x);
    ws.rows[static_cast<size_t>(e)] = n;
    clock.lap("rows in/out");
    if (bf16)
      ws.bf16.fc1_forward(e, n, x, pre);
    else
      fc1_forward(n, M, hl, x, w.w1.data() + e * M * hl, pre);
    clock.lap("expert products");
    if (bf16) {  // bias + GeLU fused with packing act (timed as products)
      ws.bf16.bias_gelu_fc2_forward(e, n, pre, w.b1.data() + e * hl, ws.out_rows.data());
    } else {
      float* act = ws.act[static_cast<size_t>(e)].data();
      cpu::bias_gelu(pre, w.b1.data() + e * hl, act, n, hl);
      clock.lap("bias + GeLU");
      fc2_forward(n, M, hl, act, w.w2.data() + e * hl * M, ws.out_rows.data());
    }
    clock.lap("expert products");
    if (add_b2) cpu::add_bias(ws.out_rows.data(), w.b2.data() + e * M, n, M);
    clock.lap("bias + GeLU");
    scatter_filled(ws.out_rows.data(), blocks, e_loc, slots, e, fills, M, out);
    clock.lap("rows in/out");
  }
}

void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                      const int32_t* fills, ExpertWorkspace& ws, ExpertShards& dw, Tensor& din,
                      PhaseTimes* times) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  PARM_CHECK(dout.numel() == blocks * e_loc * slots * M && din.numel() == dout.numel(),
             "expert gradient buffers {} / {} for blocks={} E_loc={} slots={} M={}",
             shape_str(dout.shape()), shape_str(din.shape()), blocks, e_loc, slots, M);
  PhaseClock clock(times);
  float* dy = ws.d_out.data();
  float* dact = ws.d_act.data();
  const bool bf16 = ws.precision == Precision::kBf16;
  for (int64_t e = 0; e < e_loc; ++e) {
    const float* pre = ws.pre[static_cast<size_t>(e)].data();
    const int64_t n = gather_filled(dout, blocks, e_loc, slots, e, fills, M, dy);
    PARM_CHECK_EQ(n, ws.rows[static_cast<size_t>(e)]);
    clock.lap("rows in/out");
    cpu::bias_backward(dy, dw.b2.data() + e * M, n, M);
    clock.lap("GeLU + bias backward");
    if (bf16)
      ws.bf16.fc2_backward(e, n, dy, dw.w2.data() + e * hl * M, dact);
    else
      fc2_backward(n, M, hl, ws.act[static_cast<size_t>(e)].data(), dy,
                   w.w2.data() + e * hl * M, dw.w2.data() + e * hl * M, dact);
    clock.lap("expert products");
    if (bf16) {  // GeLU + bias backward fused with packing dpre (timed as products)
      ws.bf16.gelu_backward_fc1_backward(e, n, pre, w.b1.data() + e * hl, dact,
                                         dw.b1.data() + e * hl, dw.w1.data() + e * M * hl,
                                         ws.out_rows.data());
    } else {
      const float* x = ws.in[static_cast<size_t>(e)].data();
      cpu::bias_gelu_backward(pre, w.b1.data() + e * hl, dact, dact, dw.b1.data() + e * hl, n,
                              hl);
      clock.lap("GeLU + bias backward");
      fc1_backward(n, M, hl, x, dact, w.w1.data() + e * M * hl, dw.w1.data() + e * M * hl,
                   ws.out_rows.data());
    }
    clock.lap("expert products");
    scatter_filled(ws.out_rows.data(), blocks, e_loc, slots, e, fills, M, din);
    clock.lap("rows in/out");
  }
}

}  // namespace parm::moe
