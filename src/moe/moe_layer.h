// The distributed MoE layer: one rank's part of docs/spec.md §2 under a schedule of docs/spec.md §3.
//
// Every rank of an MP group passes the same x (T, M) and gets the same out (T, M) back; in
// the backward pass dout arrives identical on the MP group and dx leaves identical on it.
// The rank holds the whole gate weight and the shards of its E/N_EP experts (ESP rank j of
// N_ESP: columns [j*H/N_ESP, (j+1)*H/N_ESP) of W1/b1, the same rows of W2, and all of b2).
//
// The layer computes on the topology's device (topo.device()): its parameters, gradients and
// step buffers live there, the compute steps run on its backend (moe/backend.h) and the
// collectives on the topology's communicators for that device (device buffers: NCCL, or MPI
// staged through host memory). `precision`: of the expert products (bf16 on both backends:
// the CPU's AMX, AVX512-BF16 or portable bf16 GEMM, cuBLAS bf16 GEMMs on the GPU).
// forward()/backward() take x / dout on any device and return tensors on the layer's.
#pragma once

#include <memory>
#include <vector>

#include "moe/backend.h"
#include "moe/dense_mover.h"
#include "moe/moe_ops.h"
#include "moe/reference_moe.h"
#include "moe/row_mover.h"
#include "moe/step_buffers.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {

struct MoeLayerParams {
  Tensor wg;                 // (M, E) whole, on every rank
  moe::ExpertShards experts; // this rank's shards
  // Shared experts (docs/spec.md §9): this MP rank's shard of each, (N_s, M, H_s / N_MP)...,
  // b2 whole; and the shared gate's weight (M), whole on every rank. Empty without them.
  moe::ExpertShards shared;
  Tensor shared_gate;

  int64_t bytes() const {
    int64_t b = wg.bytes() + shared_gate.bytes();
    for (const Tensor* t : experts.all()) b += t->bytes();
    for (const Tensor* t : shared.all()) b += t->bytes();
    return b;
  }
};
// to = from, tensor by tensor (same shapes, any devices).
void copy_params(const MoeLayerParams& from, MoeLayerParams& to);
// An independent copy of p on `device`.
MoeLayerParams params_on(const MoeLayerParams& p, Device device);

class MoeLayer {
 public:
  // fuse: S1/S2 use the fused dispatch and combine collectives, pipelined over `chunks`.
  // router_z_loss: the z-loss is on (l_z() computed, backward takes dl_z; CPU only), and its
  // statistic travels with l_aux's (schedule::LayerSpec::z_loss). aux_scope kGlobal: l_aux
  // and l_z are over the micro-step's tokens on every dp replica (schedule::LayerSpec).
  // share_params: another layer of the same shape whose parameter and gradient tensors and
  // router bias this one uses (a Tensor copy shares storage; one block's layers, one per
  // activation slot), allocating none of its own; null: its own.
  // acts_pool (--recompute moe-act; CPU; null: none): the experts keep their activation rows
  // in this pool, shared with other layers, and the backward pass recomputes them (the
  // experts' forward again, on the experts' input buffer, which the layer keeps) right before
  // the experts' adjoint: no collective is repeated, the gradients are the same bits.
  // pool_buffers (--recompute moe; with acts_pool, CPU): also the step
  // buffers that only compute steps write (the gate's statistics where no collective sums
  // them, the dispatch's output, the experts' output before their collective, the combine's
  // output) and every buffer's gradient are the pool's. The buffers collectives wrote stay
  // the layer's, so the backward pass first replays the forward's compute steps alone (the
  // gate, the dispatch, the experts, the combine) from them and from the layer's input: no
  // collective is repeated, and the gradients are the same bits.
  // Allocations are counted (parm/memory.h) as parameters and gradients for those, and under
  // the caller's memory kind for everything else the layer holds.
  MoeLayer(Topology& topo, const MoeShape& shape, schedule::Kind kind, bool fuse = false,
           int chunks = fused_plan::kDefaultChunks, Precision precision = Precision::kFp32,
           bool router_z_loss = false, AuxScope aux_scope = AuxScope::kMicroBatch,
           const MoeLayer* share_params = nullptr, moe::ActivationPool* acts_pool = nullptr,
           bool pool_buffers = false);
  MoeLayer(const MoeLayer&) = delete;  // its movers keep references to its members
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeShape& shape() const { return shape_; }
  const schedule::Schedule& schedule() const { return schedule_; }
  Device device() const { return backend_->device(); }
  Precision precision() const { return backend_->precision(); }
  moe::LayerBackend& backend() { return *backend_; }
  int first_expert() const { return first_expert_; }  // global index of local expert 0
  int esp_rank() const { return esp_rank_; }
  int esp_size() const { return esp_size_; }
  int mp_rank() const { return mp_rank_; }  // the shared experts' shard
  int mp_size() const { return mp_size_; }

  MoeLayerParams& params() { return params_; }
  MoeLayerParams& grads() { return grads_; }
  // Copies this rank's shards out of whole (unsharded) parameters / into whole gradients.
  void load_whole(const ref::MoeParams<float>& whole);
  void store_whole_grads(ref::MoeParams<float>& whole) const;  // overwrites this rank's part

  // out (T, M) for x (T, M); the returned tensor lives until the next forward().
  const Tensor& forward(const Tensor& x);
  float l_aux() const { return l_aux_; }
  float l_z() const { return l_z_; }  // 0 unless built with the router z-loss
  // DeepSeek-V3's router bias (E): added to the probabilities for the top-k choice only.
  // Zero at construction (then the gate runs unbiased); CPU layers only when nonzero.
  std::vector<float>& router_bias() { return *router_bias_; }
  // From now on this layer's router bias is `other`'s (one block's layers, one per slot).
  void share_router_bias(MoeLayer& other) { router_bias_ = other.router_bias_; }
  // dx (T, M) for dout (T, M) and the gradient dl_aux of the loss with respect to l_aux.
  // Accumulates (+=) the parameter gradients; the returned dx lives until the next call.
  // dl_z: the gradient of the loss with respect to l_z (nonzero only with router_z_loss).
  const Tensor& backward(const Tensor& dout, float dl_aux, float dl_z = 0.0f);
  // The same passes with their result written into `out` / `dx` (shape (T, M), on the
  // layer's device; e.g. a view of a caller's memory) in place of the layer's own buffer,
  // so the caller gets it without a copy. The layer keeps no reference to `out` / `dx`.
  void forward_into(const Tensor& x, const Tensor& out);
  void backward_into(const Tensor& dout, float dl_aux, const Tensor& dx, float dl_z = 0.0f);
  void zero_grad();

  // The same passes in pieces, for a caller that computes something else while the layer's
  // AllToAll moves tokens (train/pipeline.h's overlap of two micro-batches): the steps of
  // forward() / backward(), but each AllToAll step is posted and left in flight.
  // start_forward / start_backward take the input and run up to the first AllToAll;
  // resume() waits for the one in flight and runs on to the next. Each returns true while an
  // AllToAll is in flight (call resume() later), false once the pass has ended; its result
  // is then pass_result() (what forward() / backward() return). Bit-identical to
  // forward() / backward(). A step's time (forward_step_us ...) is its post plus its wait,
  // not the caller's work in between (moe_layer_split.cpp).
  bool start_forward(const Tensor& x);
  bool start_backward(const Tensor& dout, float dl_aux, float dl_z = 0.0f);
  bool resume();
  const Tensor& pass_result() const;

  // Per-step timing (default on). On a device it waits for the GPU after every step; off,
  // the device work of consecutive steps overlaps their host work and the step times below
  // stay zero (the pass as a whole still ends with a wait).
  void set_step_timing(bool on) { step_timing_ = on; }
  // Wall time of each step in the last forward / backward pass (microseconds), and of the
  // named phases inside the compute steps (gate, experts).
  const std::vector<double>& forward_step_us() const { return fwd_us_; }
  const std::vector<double>& backward_step_us() const { return bwd_us_; }
  const std::vector<moe::PhaseTimes>& forward_phases() const { return fwd_phases_; }
  const std::vector<moe::PhaseTimes>& backward_phases() const { return bwd_phases_; }
  // Filled rows of each local expert in the last forward pass (what the expert products
  // really computed), and the expert shard's hidden width H / N_ESP.
  const std::vector<int64_t>& expert_rows() const { return backend_->expert_rows(); }
  int64_t shard_hidden() const { return params_.experts.w1.dim(2); }
  // Bytes this layer holds: parameters, gradients, step buffers and their gradients, the
  // interleaving scratch, the dropless reductions' scratch and row exchanges' packing
  // buffers, and the backend's buffers (routing, saved tensors, expert workspace), all
  // allocated at construction. Not counted: the host fill-count and segment-start vectors
  // (a few integers per expert), sized on the first forward pass.
  int64_t held_bytes() const;
  // Of held_bytes(): the dropless reductions' scratch (0 with a capacity factor).
  int64_t row_scratch_bytes() const { return rows_ ? rows_->scratch_bytes() : 0; }
  // Of held_bytes(): the row exchanges' packing buffers (0 with a capacity factor).
  int64_t row_packing_bytes() const { return rows_ ? rows_->packing_bytes() : 0; }
  // Rows of M floats the layer holds for step buffer id (its gradient holds as many): the
  // shape's, or under a dropless schedule the rows routed at most.
  int64_t buffer_rows(int id) const { return bufs_.pass_numel(id, false) / shape_.model_dim; }
  // The routing of the last forward pass (gate rows: T, or T / N_MP under S1), on the host.
  const moe::GateRouting& routing() { return backend_->routing(); }

 private:
  // Step s's forward (or backward) pass: its computation, or the move schedule::step_info
  // names for it, with its joined sum (Step::joined_sum) posted before the move and
  // completed after it.
  void run_step(const schedule::Step& s, bool backward, float dl_aux);
  // The pass without the joined sum: a computation, or the move by the step's mover.
  void run_pass(const schedule::Step& s, bool backward, float dl_aux);
  void compute_forward(const schedule::Step& s, moe::PhaseTimes* phases);
  // The gate step's forward with its statistics written to `stats`.
  void run_gate(const schedule::Step& s, float* stats, moe::PhaseTimes* phases);
  // --recompute moe: the forward's compute steps again, before a backward pass.
  void replay_forward();
  void compute_backward(const schedule::Step& s, float dl_aux, moe::PhaseTimes* phases);
  // Whether step i is an AllToAll left in flight while step i + 1 runs in this pass
  // (schedule::Step::overlap_next), and that pair run so: post, compute, wait. `us` gets both
  // steps' times (the AllToAll's: its post plus its wait).
  bool overlaps_next(size_t i, bool backward) const;
  void run_overlapped(size_t i, bool backward, float dl_aux, std::vector<double>& us);
  // After a backward pass: this call's gate weight (and shared gate) gradients, summed over
  // mp where the schedule sums them, added into grads_.
  void add_weight_grads();
  // Checks and keeps dl_z for the backward pass that starts.
  void set_dl_z(float dl_z);
  // Zeroes the accumulated gradients and takes dout as the output's gradient.
  void begin_backward(const Tensor& dout);
  // The split pass (start_forward ...): runs its steps from split_.done on until an AllToAll
  // is posted (true) or the pass has ended (false).
  bool run_split_steps();
  struct SplitPass {
    bool active = false;
    bool backward = false;
    float dl_aux = 0.0f;
    size_t done = 0;           // steps run (or posted), in the pass's order
    RequestPtr in_flight;      // the posted AllToAll of step `posted`
    size_t posted = 0;         // its index in schedule_.steps
    double post_us = 0.0;      // the time its post took
  };

  Topology& topo_;
  MoeShape shape_;
  bool recompute_experts_ = false;  // moe-act: the experts step recomputes its rows
  schedule::Schedule schedule_;
  int first_expert_ = 0;
  int esp_rank_ = 0;
  int esp_size_ = 1;
  int mp_rank_ = 0;
  int mp_size_ = 1;
  std::unique_ptr<moe::LayerBackend> backend_;
  MoeLayerParams params_;
  MoeLayerParams grads_;

  std::vector<bool> pooled_;  // --recompute moe: by buffer id, the pool's (else empty)
  StepBuffers bufs_;
  Tensor replay_stats_;  // (2E + 1) the replayed gate's statistics where they are kept
  std::vector<bool> accumulated_;  // by buffer id: its gradient is accumulated (+=), zeroed
                                   // before each backward pass
  // The movers (moe/mover.h): rows_ only under dropless routing, for the steps on segmented
  // buffers (schedule::moves_routed_rows); dense_ for the other collectives. By step index,
  // the one that runs its moves (null for compute steps).
  std::unique_ptr<DenseMover> dense_;
  std::unique_ptr<RowMover> rows_;
  std::vector<Mover*> movers_;
  float l_aux_ = 0.0f;
  float l_z_ = 0.0f;
  std::shared_ptr<std::vector<float>> router_bias_;
  float dl_z_ = 0.0f;  // of the backward pass running
  bool step_timing_ = true;
  // Whether the passes time their steps and phases (on a device only when asked: the GPU
  // backend waits for the GPU at every step and phase it times).
  bool step_timed() const { return step_timing_ || device() == Device::kCpu; }
  std::vector<double> fwd_us_, bwd_us_;
  std::vector<moe::PhaseTimes> fwd_phases_, bwd_phases_;
  SplitPass split_;
};

}  // namespace parm
