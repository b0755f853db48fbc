// Megatron tensor parallelism over the `mp` group: the two conjugate operators.
//
//   f: identity forward, all-reduce backward. Sits in front of a column-parallel layer
//      (QKV, fc1): every MP rank reads the same (complete) input, so the input gradient is
//      the sum of the ranks' partial gradients.
//   g: all-reduce forward, identity backward. Sits after a row-parallel layer (attention
//      projection, fc2): each rank's output is a partial sum over its slice of the inner
//      dimension; the output gradient is already complete on every rank.
//
// Both all-reduce a (T, M) tensor in place; the time they take is added to comm_us. The
// vocabulary-parallel loss (model/vocab_parallel.h) reduces its per-row numbers with
// row_max / row_sum, counted the same way.
#pragma once

#include <cstdint>

#include "parm/comm.h"
#include "parm/timer.h"

namespace parm::model {

class TensorParallel {
 public:
  explicit TensorParallel(Communicator& mp) : mp_(mp) {}
  int rank() const { return mp_.rank(); }
  int size() const { return mp_.size(); }

  // g forward: x (n) = sum over the MP group of the partial x (n). In place.
  void g_forward(float* x, int64_t n) { allreduce(x, n); }
  // f backward: dx (n) = sum over the MP group of the partial dx (n). In place.
  void f_backward(float* dx, int64_t n) { allreduce(dx, n); }
  // x (n) = the element-wise max over the MP group. In place.
  void row_max(float* x, int64_t n) { allreduce(x, n, DType::kF32, ReduceOp::kMax); }
  // x (n) = the sum over the MP group, in double. In place.
  void row_sum(double* x, int64_t n) { allreduce(x, n, DType::kF64, ReduceOp::kSum); }

  double comm_us = 0.0;  // accumulated; the model resets it per step

 private:
  void allreduce(void* x, int64_t n, DType dtype = DType::kF32, ReduceOp op = ReduceOp::kSum) {
    if (mp_.size() == 1) return;
    const double t0 = now_us();
    mp_.allreduce(x, static_cast<size_t>(n), dtype, op);
    comm_us += now_us() - t0;
  }
  Communicator& mp_;
};

}  // namespace parm::model
