// Dispatch into the [E, slots, M] buffer and combine out of it (SPEC §2 items 4 and 6).
#include <cstring>

#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe {

void dispatch_forward(const Tensor& x, const GateRouting& r, Tensor& buf) {
  const int64_t M = x.cols();
  PARM_CHECK(buf.numel() == r.experts * r.slots * M, "dispatch buffer {} for E={} slots={} M={}",
             shape_str(buf.shape()), r.experts, r.slots, M);
  buf.zero();
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.topk; ++j) {
      const int64_t row = r.row[static_cast<size_t>(t * r.topk + j)];
      if (row >= 0) std::memcpy(buf.data() + row * M, x.row(t), static_cast<size_t>(M) * 4);
    }
}

void dispatch_backward(const Tensor& dbuf, const GateRouting& r, Tensor& dx) {
  const int64_t M = dx.cols();
  for (int64_t t = 0; t < r.tokens; ++t) {
    float* d = dx.row(t);
    for (int j = 0; j < r.topk; ++j) {
      const int64_t row = r.row[static_cast<size_t>(t * r.topk + j)];
      if (row < 0) continue;
      const float* s = dbuf.data() + row * M;
      for (int64_t m = 0; m < M; ++m) d[m] += s[m];
    }
  }
}

void combine_forward(const Tensor& buf, const GateRouting& r, Tensor& out) {
  const int64_t M = out.cols();
  out.zero();
  for (int64_t t = 0; t < r.tokens; ++t) {
    float* o = out.row(t);
    for (int j = 0; j < r.topk; ++j) {
      const size_t i = static_cast<size_t>(t * r.topk + j);
      if (r.row[i] < 0) continue;
      const float w = r.weight[i];
      const float* y = buf.data() + r.row[i] * M;
      for (int64_t m = 0; m < M; ++m) o[m] += w * y[m];
    }
  }
}

void combine_backward(const Tensor& buf, const Tensor& dout, const GateRouting& r, Tensor& dbuf,
                      std::vector<float>& dweight) {
  const int64_t M = dout.cols();
  dbuf.zero();
  dweight.assign(static_cast<size_t>(r.tokens * r.topk), 0.0f);
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* g = dout.row(t);
    for (int j = 0; j < r.topk; ++j) {
      const size_t i = static_cast<size_t>(t * r.topk + j);
      if (r.row[i] < 0) continue;
      const float w = r.weight[i];
      const float* y = buf.data() + r.row[i] * M;
      float* d = dbuf.data() + r.row[i] * M;
      float dot = 0.0f;
      for (int64_t m = 0; m < M; ++m) {
        d[m] = w * g[m];
        dot += g[m] * y[m];
      }
      dweight[i] = dot;
    }
  }
}

}  // namespace parm::moe
