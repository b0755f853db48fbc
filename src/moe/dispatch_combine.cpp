// Dispatch into the [E, slots, M] buffer and combine out of it (docs/spec.md §2 items 4 and 6).
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe {
namespace {

// Zeroes the rows of `buf` (E * slots, M) that no kept choice fills: expert e's slots
// [fill_e, slots) (GShard fills an expert's slots in order from 0). The packed layout has no
// such rows.
void zero_unfilled(const GateRouting& r, int64_t M, Tensor& buf) {
  if (!r.first.empty()) return;
  for (int64_t e = 0; e < r.experts; ++e) {
    const int64_t f = r.fill[static_cast<size_t>(e)];
    std::memset(buf.data() + (e * r.slots + f) * M, 0,
                static_cast<size_t>((r.slots - f) * M) * sizeof(float));
  }
}

}  // namespace

void dispatch_forward(const Tensor& x, const GateRouting& r, Tensor& buf, bool zero_unrouted) {
  const int64_t M = x.cols();
  if (r.first.empty())
    PARM_CHECK(buf.numel() == r.experts * r.slots * M, "dispatch buffer {} for E={} slots={} M={}",
               shape_str(buf.shape()), r.experts, r.slots, M);
  else  // packed: the routed rows back to back
    PARM_CHECK(r.experts == 0 || (r.start(r.experts - 1) + r.fill.back()) * M <= buf.numel(),
               "packed dispatch buffer {} for {} routed rows of M={}", shape_str(buf.shape()),
               r.start(r.experts - 1) + r.fill.back(), M);
  if (zero_unrouted) zero_unfilled(r, M, buf);
  // A large buffer is written past the cache: it is read only by the exchange after it.
  const bool stream = cpu::streamed(buf.bytes());
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.topk; ++j) {
      const int64_t row = r.row[static_cast<size_t>(t * r.topk + j)];
      if (row < 0) continue;
      if (stream)
        cpu::copy_stream(buf.data() + row * M, x.row(t), M);
      else
        std::memcpy(buf.data() + row * M, x.row(t), static_cast<size_t>(M) * 4);
    }
  if (stream) cpu::stream_fence();
}

void dispatch_backward(const Tensor& dbuf, const GateRouting& r, Tensor& dx) {
  const int64_t M = dx.cols();
  for (int64_t t = 0; t < r.tokens; ++t)
    cpu::gather_add_rows(dbuf.data(), M, &r.row[static_cast<size_t>(t * r.topk)], nullptr,
                         r.topk, dx.row(t));
}

void combine_forward(const Tensor& buf, const GateRouting& r, Tensor& out) {
  const int64_t M = out.cols();
  out.zero();
  for (int64_t t = 0; t < r.tokens; ++t) {
    const size_t i = static_cast<size_t>(t * r.topk);
    cpu::gather_add_rows(buf.data(), M, &r.row[i], &r.weight[i], r.topk, out.row(t));
  }
}

void combine_backward(const Tensor& buf, const Tensor& dout, const GateRouting& r, Tensor& dbuf,
                      std::vector<float>& dweight, bool zero_unrouted) {
  const int64_t M = dout.cols();
  if (zero_unrouted) zero_unfilled(r, M, dbuf);
  dweight.assign(static_cast<size_t>(r.tokens * r.topk), 0.0f);
  const bool stream = cpu::streamed(dbuf.bytes());  // as dispatch_forward's buffer
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* g = dout.row(t);
    for (int j = 0; j < r.topk; ++j) {
      const size_t i = static_cast<size_t>(t * r.topk + j);
      if (r.row[i] < 0) continue;
      const float w = r.weight[i];
      const float* y = buf.data() + r.row[i] * M;
      float* d = dbuf.data() + r.row[i] * M;
      if (stream)
        cpu::scale_stream(d, g, w, M);
      else
        for (int64_t m = 0; m < M; ++m) d[m] = w * g[m];
      dweight[i] = cpu::dot_lanes(g, y, M);
    }
  }
  if (stream) cpu::stream_fence();
}

}  // namespace parm::moe
