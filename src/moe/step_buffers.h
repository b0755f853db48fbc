// The buffers one MoE layer call moves its tokens through (schedule::Schedule::buffers), as
// the layer holds them: each buffer's tensor and its gradient's, this call's gate-weight
// gradient, and for the segmented buffers (the dispatch and combine paths) the fill counts
// of their segments, with the exchange that carries the counts beside the tokens. What the
// executor's compute steps (moe_layer.cpp) and its movers (moe/mover.h) share.
//
// All tensors are allocated at construction on the topology's device; the fill counts and
// segment starts are host vectors of a few integers per segment, sized on the first pass.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/metadata.h"
#include "moe/activation_pool.h"
#include "parm/tensor.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {

// --recompute moe: the buffers a backward pass can make again without a collective, those
// that only compute steps write (no collective writes them as its output, its intermediate
// buffer or its joined sum); the layer's input (the caller's copy) is not one. By buffer id.
std::vector<bool> recomputable_buffers(const schedule::Schedule& sc);

class StepBuffers {
 public:
  // Buffer i holds its shape's elements, or, dropless and segmented, its max_routed_rows
  // rows of M, segments back to back (the packed layout, docs/dropless.md). The gate's
  // statistics buffer is a view of 2E of the 2E + 1 values the backends write when the
  // schedule has no z-loss.
  // pool (--recompute moe; null: none): every gradient and the values whose pooled_values
  // flag is set are the pool's (moe/activation_pool.h), shared with other layers, bound at
  // bind(); the others are allocated here.
  StepBuffers(Topology& topo, const schedule::Schedule& sc, const MoeShape& shape,
              moe::ActivationPool* pool = nullptr, const std::vector<bool>& pooled_values = {});
  StepBuffers(const StepBuffers&) = delete;
  StepBuffers& operator=(const StepBuffers&) = delete;

  // Points the pooled buffers at the pool's storage in its current lane (before a pass; a
  // no-op without a pool or where they already point there).
  void bind();
  Tensor& value(int id) { return values_[static_cast<size_t>(id)]; }
  Tensor& grad(int id) { return grads_[static_cast<size_t>(id)]; }
  const Tensor& value(int id) const { return values_[static_cast<size_t>(id)]; }
  const Tensor& grad(int id) const { return grads_[static_cast<size_t>(id)]; }
  size_t size() const { return values_.size(); }
  int64_t model_dim() const { return model_dim_; }  // M: the floats of one row
  // This call's gate-weight gradient (M, E), before S1's sum over mp (schedule::kGateWeight),
  // and the shared gate's (M; empty without it), which follows it in one buffer.
  Tensor& dwg_call() { return dwg_call_; }
  Tensor& dsg_call() { return dsg_call_; }
  // Both (zeroed by the layer before each backward pass).
  Tensor& dweights_call() { return dweights_call_; }
  // What a pass reads or writes of buffer id: the buffer forward, its gradient backward
  // (kGateWeight: dwg_call()).
  Tensor& pass(int id, bool backward);
  // Its elements, also before bind() (a mover sizing its scratch at construction).
  int64_t pass_numel(int id, bool backward) const;

  // The filled rows of each segment of buffer id (empty: not yet known, or not segmented).
  // A buffer with BufferSpec::fills_like has that buffer's counts (the combine path
  // mirrors the dispatch path): both ids name one vector. The counts follow the tokens of
  // the forward pass, from the dispatch to the experts; the backward pass reads them.
  std::vector<int32_t>& fills(int id) { return fills_[own_fills_[static_cast<size_t>(id)]]; }
  // Dropless: buffer id's segment starts (rows) for its current fill counts, the packed
  // layout's prefix sum (shape/packed_rows.h), checked to fit the buffer. Null with a
  // capacity factor (segment i starts at row i x slots).
  const int64_t* starts(int id);

  // Posts the exchange of the fill counts `in` over group g's host communicator (an
  // alltoall, or an allgather when `gather`) into `out`, sized for what arrives;
  // wait_fills() completes it (a no-op when none is posted).
  void post_fills(Group g, bool gather, const std::vector<int32_t>& in,
                  std::vector<int32_t>& out);
  void wait_fills() { meta_.wait(); }
  // The forward pass of a step that carries_fills: post_fills of s.in's counts into s.out's
  // over s.group. Otherwise nothing.
  void post_step_fills(const schedule::Step& s, bool backward, bool gather) {
    if (!backward && s.carries_fills) post_fills(s.group, gather, fills(s.in), fills(s.out));
  }
  // The fused dispatch's counts between its two hops (EP-exchanged, not yet ESP-gathered).
  std::vector<int32_t>& fills_stage() { return fills_stage_; }

  // Bytes of the tensors (buffers, gradients, dwg_call()) the layer owns (not the pool's).
  int64_t held_bytes() const;

 private:
  Topology& topo_;
  const schedule::Schedule& sc_;
  int64_t model_dim_;
  std::vector<Tensor> values_;  // by buffer id (aliased ids share one tensor)
  std::vector<Tensor> grads_;   // their gradients
  Tensor dweights_call_;  // (gate_weight_numel)
  Tensor dwg_call_;       // views of it
  Tensor dsg_call_;
  std::vector<size_t> own_fills_;  // by buffer id: the id whose counts it has (fills_like)
  std::vector<std::vector<int32_t>> fills_;   // by that id
  std::vector<std::vector<int64_t>> starts_;  // by buffer id: packed segment starts
  std::vector<int32_t> fills_stage_;
  MetadataExchange meta_;
  moe::ActivationPool* pool_ = nullptr;
  int bound_lane_ = -1;  // the pool's lane the pooled views point at (-1: none yet)
  std::vector<std::pair<size_t, bool>> pooled_;  // (buffer id, gradient) of the pool's
  std::vector<Shape> held_;                      // by buffer id: the shape allocated
  std::vector<int64_t> seen_;                    // by buffer id: the length seen, or -1
};

}  // namespace parm
