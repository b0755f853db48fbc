// The local experts (ESP shards) over the exchange layout (blocks, E_loc, slots, M).
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe {
namespace {

// Copies expert e's rows between the exchange layout and a contiguous (blocks*slots, M).
void gather_expert(const Tensor& layout, int64_t blocks, int64_t e_loc, int64_t slots, int64_t e,
                   Tensor& rows) {
  const int64_t M = rows.cols();
  const size_t n = static_cast<size_t>(slots * M) * sizeof(float);
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(rows.data() + b * slots * M, layout.data() + ((b * e_loc + e) * slots) * M, n);
}

void scatter_expert(const Tensor& rows, int64_t blocks, int64_t e_loc, int64_t slots, int64_t e,
                    Tensor& layout) {
  const int64_t M = rows.cols();
  const size_t n = static_cast<size_t>(slots * M) * sizeof(float);
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(layout.data() + ((b * e_loc + e) * slots) * M, rows.data() + b * slots * M, n);
}

void ensure(Tensor& t, Shape shape) {
  if (t.shape() != shape) t = Tensor(std::move(shape));
}

}  // namespace

void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                     bool add_b2, ExpertWorkspace& ws, Tensor& out) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  const int64_t R = blocks * slots;
  PARM_CHECK(in.numel() == blocks * e_loc * slots * M && out.numel() == in.numel(),
             "expert buffers {} / {} for blocks={} E_loc={} slots={} M={}",
             shape_str(in.shape()), shape_str(out.shape()), blocks, e_loc, slots, M);
  ws.in.resize(static_cast<size_t>(e_loc));
  ws.pre.resize(static_cast<size_t>(e_loc));
  ws.act.resize(static_cast<size_t>(e_loc));
  ensure(ws.out_rows, {R, M});
  for (int64_t e = 0; e < e_loc; ++e) {
    Tensor& x = ws.in[static_cast<size_t>(e)];
    Tensor& pre = ws.pre[static_cast<size_t>(e)];
    Tensor& act = ws.act[static_cast<size_t>(e)];
    ensure(x, {R, M});
    ensure(pre, {R, hl});
    ensure(act, {R, hl});
    gather_expert(in, blocks, e_loc, slots, e, x);
    cpu::gemm(false, false, R, hl, M, x.data(), w.w1.data() + e * M * hl, pre.data(), false);
    cpu::bias_gelu_forward(pre.data(), w.b1.data() + e * hl, act.data(), R, hl);
    cpu::gemm(false, false, R, M, hl, act.data(), w.w2.data() + e * hl * M, ws.out_rows.data(),
              false);
    if (add_b2) cpu::add_bias(ws.out_rows.data(), w.b2.data() + e * M, R, M);
    scatter_expert(ws.out_rows, blocks, e_loc, slots, e, out);
  }
}

void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                      ExpertWorkspace& ws, ExpertShards& dw, Tensor& din) {
  const int64_t e_loc = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  const int64_t R = blocks * slots;
  ensure(ws.d_act, {R, hl});
  ensure(ws.d_out, {R, M});
  ensure(ws.out_rows, {R, M});
  Tensor& dy = ws.d_out;
  for (int64_t e = 0; e < e_loc; ++e) {
    const Tensor& x = ws.in[static_cast<size_t>(e)];
    const Tensor& pre = ws.pre[static_cast<size_t>(e)];
    const Tensor& act = ws.act[static_cast<size_t>(e)];
    gather_expert(dout, blocks, e_loc, slots, e, dy);
    cpu::bias_backward(dy.data(), dw.b2.data() + e * M, R, M);
    cpu::gemm(true, false, hl, M, R, act.data(), dy.data(), dw.w2.data() + e * hl * M, true);
    cpu::gemm(false, true, R, hl, M, dy.data(), w.w2.data() + e * hl * M, ws.d_act.data(), false);
    cpu::gelu_backward(pre.data(), ws.d_act.data(), ws.d_act.data(), R * hl);
    cpu::bias_backward(ws.d_act.data(), dw.b1.data() + e * hl, R, hl);
    cpu::gemm(true, false, M, hl, R, x.data(), ws.d_act.data(), dw.w1.data() + e * M * hl, true);
    cpu::gemm(false, true, R, M, hl, ws.d_act.data(), w.w1.data() + e * M * hl,
              ws.out_rows.data(), false);
    scatter_expert(ws.out_rows, blocks, e_loc, slots, e, din);
  }
}

}  // namespace parm::moe
