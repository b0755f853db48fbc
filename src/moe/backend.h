// The compute of the MoE layer on one device. The executor (moe_layer.cpp) runs a schedule's
// steps: the communicators move the data, a LayerBackend computes the compute steps (gate,
// dispatch, experts, combine and their adjoints) and the local data movement around the
// collectives. The CPU backend (cpu_backend.cpp, over moe_ops.h) is the oracle's twin; the
// CUDA backend (src/moe/cuda/) computes the same maths on the GPU.
//
// One backend per layer: it owns the routing of the last forward pass, the gate's saved
// probabilities, the combine-weight gradients and the experts' workspace, all sized once at
// construction (the steady state allocates nothing). Every Tensor / float* passed in lives
// on device() unless marked "host". Work may be queued asynchronously; sync() waits for it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moe/moe_ops.h"
#include "moe/phase_times.h"
#include "parm/error.h"
#include "parm/device.h"
#include "parm/tensor.h"

namespace parm::moe {

// The sizes a backend reserves for.
struct BackendSizes {
  int64_t gate_rows = 0;         // rows of one gate call (T, or T / N_MP under S1)
  int64_t experts = 0;           // E
  int topk = 1;                  // k
  int64_t model_dim = 0;         // M
  int64_t local_experts = 0;     // E_loc
  int64_t hidden_shard = 0;      // H / N_ESP
  int64_t max_expert_rows = 0;   // rows of one local expert across all blocks of the layout
  // Dropless: the most rows all local experts get together in one pass (0: E_loc x
  // max_expert_rows, the capacity-factor bound). Both backends then pack the experts'
  // workspace into one pool of this many rows per buffer (ExpertWorkspace; the CUDA
  // DeviceExperts, each expert's rows aligned).
  int64_t max_local_rows = 0;
  // Dropless (or a capacity factor unpadded, MoeShape::packed_rows): only routed rows of the
  // dispatch-path buffers are read or sent, so the dispatch (and the combine's adjoint) leave
  // the others unwritten instead of zeroing them.
  bool dropless = false;
  // The packed layout (every dropless or unpadded MoeLayer's; docs/dropless.md): the gate
  // numbers the dispatch rows back to back (moe::pack_routing; the CUDA one on the device,
  // moe_pack_routing) and the experts read their segments at the starts they are given.
  bool packed = false;
  // The experts' kind (docs/spec.md §8): swiglu reserves the gate projection's rows.
  ExpertMlp expert_mlp = ExpertMlp::kGelu;
  // Shared experts (docs/spec.md §9): N_s FFNs of shard width H_s / N_MP over shared_rows
  // tokens, with the shared gate or not. 0: none.
  int shared_experts = 0;
  int64_t shared_rows = 0;
  int64_t shared_hidden_shard = 0;
  bool shared_gate = false;
  // The router z-loss is on: the gate computes each row's log-sum-exp (the CPU backend's;
  // off, it skips them and their sum in the statistics is 0).
  bool z_loss = false;
  // --recompute moe-act (CPU only; null: none): the routed experts' activation rows are the
  // pool's, shared with the model's other layers (moe/activation_pool.h).
  ActivationPool* acts_pool = nullptr;
};

class LayerBackend {
 public:
  virtual ~LayerBackend() = default;
  virtual Device device() const = 0;
  virtual Precision precision() const = 0;

  // ---- gate (moe_ops.h gate_forward / gate_backward, same phases) ----
  // x (rows, M), wg (M, E); stats (2E x sets + 1) = per set [first-choice counts, probability
  // sums], then the sum of lse^2 (the z-loss; the CPU backend's, a device backend leaves
  // it). Keeps the routing for the calls below.
  virtual void gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity,
                            int64_t slots, float* stats, PhaseTimes* times) = 0;
  // The router bias (E, host; null: none) of the gate calls that follow; the pointer is
  // kept. A backend without one refuses a bias.
  virtual void set_router_bias(const float* bias) {
    PARM_CHECK(bias == nullptr, "the {} layer backend has no router bias",
               device_name(device()));
  }
  // The router of the gate calls that follow (docs/spec.md §7; the shape's). A backend that
  // computes only §2's softmax top-k refuses any other.
  virtual void set_router(const RouterSpec& router) {
    PARM_CONFIG_CHECK(router.is_default(),
                      "the {} layer backend computes docs/spec.md §2's softmax top-k router "
                      "only, not{}; use --device cpu",
                      device_name(device()), router.str());
  }
  // The statistics sets of the gate calls that follow (moe_ops.h AuxRows; the sequence-wise
  // l_aux, MoeShape::aux_seq_len, with `sets` sequences). A backend whose gate writes one set
  // only refuses any other.
  virtual void set_aux_rows(const AuxRows& rows, int64_t sets) {
    PARM_CONFIG_CHECK(rows.is_default() && sets == 1,
                      "the {} layer backend computes one set of l_aux statistics per gate call, "
                      "not the sequence-wise l_aux (--aux-loss sequence); use --device cpu or "
                      "--aux-loss micro-batch|global",
                      device_name(device()));
  }
  // The version of the expert weights the calls that follow are given (whoever writes them
  // changes it with every write; moe/bf16_weight_copies.h): a backend at bf16 (CPU or CUDA)
  // rounds W1 and W2 again only when it changed, and at every forward while no version is
  // given (kUnknownVersion, the default). At fp32 there is nothing to round.
  virtual void set_weights_version(uint64_t version) {}
  // The bf16 copies of W1 and W2 the backend made so far (count) and the wall time of the
  // last one (us). Zeros from a backend that does not time them (the CUDA one queues them).
  struct WeightCopies {
    int64_t made = 0;
    double last_us = 0;
  };
  virtual WeightCopies weight_copies() const { return {}; }
  // Slots taken per expert by the last gate call (host).
  virtual const std::vector<int64_t>& fill() const = 0;
  // The last gate call's routing on the host (a copy on a device backend; for checks).
  virtual const GateRouting& routing() = 0;
  // dstats (2E x sets + 1) from l_aux and the z-loss; the combine-weight gradients come from
  // the last combine_backward. Accumulates dwg (M, E) and dx (rows, M).
  virtual void gate_backward(const Tensor& x, const Tensor& wg, const float* dstats,
                             Tensor& dwg, Tensor& dx, PhaseTimes* times) = 0;
  // l_aux and the z-loss from stats (2E x sets + 1, moe_ops.h aux_loss); their adjoint
  // overwrites dstats (the same layout).
  virtual float aux_loss(const float* stats, int64_t experts, int64_t total_tokens,
                         int64_t sets) = 0;
  virtual float z_loss(const float* stats, int64_t experts, int64_t total_tokens,
                       int64_t sets) = 0;
  virtual void aux_loss_backward(const float* stats, int64_t experts, int64_t total_tokens,
                                 int64_t sets, float dl_aux, float dl_z, float* dstats) = 0;

  // ---- dispatch / combine over the last routing (moe_ops.h) ----
  virtual void dispatch_forward(const Tensor& x, Tensor& buf) = 0;    // overwrites buf
  virtual void dispatch_backward(const Tensor& dbuf, Tensor& dx) = 0; // accumulates dx
  virtual void combine_forward(const Tensor& buf, Tensor& out) = 0;   // overwrites out
  // Overwrites dbuf; keeps the combine-weight gradients for gate_backward.
  virtual void combine_backward(const Tensor& buf, const Tensor& dout, Tensor& dbuf) = 0;

  // ---- experts (moe_ops.h experts_forward / experts_backward; fills on the host) ----
  // first (host; null: the (blocks, E_loc, slots) layout): the packed segments' starts.
  virtual void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks,
                               int64_t slots, const int32_t* fills, const int64_t* first,
                               bool add_b2, Tensor& out, PhaseTimes* times) = 0;
  virtual void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                                int64_t slots, const int32_t* fills, const int64_t* first,
                                ExpertShards& dw, Tensor& din, PhaseTimes* times) = 0;
  // Filled rows of each local expert in the last forward pass.
  virtual const std::vector<int64_t>& expert_rows() const = 0;

  // ---- shared experts (moe/shared_experts.h; BackendSizes::shared_experts > 0) ----
  // out (rows, M) = this MP rank's part of g * sum_s FFN_s(x); gate_w (M) empty: no gate.
  virtual void shared_forward(const Tensor& x, const ExpertShards& w, const Tensor& gate_w,
                              bool add_b2, Tensor& out, PhaseTimes* times) {
    (void)x, (void)w, (void)gate_w, (void)add_b2, (void)out, (void)times;
    PARM_CHECK(false, "the {} layer backend has no shared experts", device_name(device()));
  }
  // Accumulates dw, dgate_w (M) and dx (rows, M): this rank's parts.
  virtual void shared_backward(const Tensor& x, const Tensor& dout, const ExpertShards& w,
                               const Tensor& gate_w, ExpertShards& dw, Tensor& dgate_w,
                               Tensor& dx, PhaseTimes* times) {
    (void)x, (void)dout, (void)w, (void)gate_w, (void)dw, (void)dgate_w, (void)dx, (void)times;
    PARM_CHECK(false, "the {} layer backend has no shared experts", device_name(device()));
  }
  // The floor: the six expert products of every expert (rows[e] each) run alone, `reps`
  // times on scratch memory of this device; median total (us).
  virtual double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim,
                                         int64_t hidden_shard, int reps) = 0;

  // ---- local data movement ----
  // mine (outer, chunk) = full (outer, n, chunk)[:, j, :] ("keep my slice").
  virtual void take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk,
                          float* mine) = 0;
  // full (outer, n, chunk)[:, p, :] = parts (n, outer, chunk)[p] (an allgather's blocks
  // interleaved).
  virtual void interleave(const float* parts, int64_t outer, int n, int64_t chunk,
                          float* full) = 0;
  virtual void add(float* dst, const float* src, int64_t n) = 0;  // dst += src

  // Waits for the work queued so far (no-op on the CPU).
  virtual void sync() = 0;
  // Bytes of the backend's own buffers (routing, saved tensors, expert workspace).
  virtual int64_t held_bytes() const = 0;
};

// The router options a device's backend computes: the CPU one the z-loss, the router bias
// and every RouterSpec; the CUDA gate none of them. Throws InvalidConfig naming the option
// (flag and config key) when `device` cannot run a non-default one, so a run is refused
// before any work, not at its first pass. Needs no GPU: it looks at the names only.
void check_router_options(Device device, float router_z_loss, float router_bias_update,
                          const RouterSpec& router = {});
// The expert kinds a device's backend computes at a precision: gelu everywhere, swiglu on the
// CPU (fp32 and bf16). Throws InvalidConfig naming the flag, the config key and what would be
// valid.
void check_expert_mlp(Device device, Precision precision, ExpertMlp mlp);
// Shared experts (docs/spec.md §9): on the CPU (fp32 and bf16). Throws InvalidConfig naming
// the flags.
void check_shared_experts(Device device, Precision precision, int shared_experts);

// Throws InvalidConfig when `device` / `precision` cannot run in this build or machine.
std::unique_ptr<LayerBackend> make_backend(Device device, Precision precision,
                                           const BackendSizes& sizes);
// The CPU backend (cpu_backend.cpp; bf16: the AMX, AVX512-BF16 or portable bf16 GEMM of the
// CPU kernels); the CUDA one is make_cuda_backend (moe/cuda/).
std::unique_ptr<LayerBackend> make_cpu_backend(const BackendSizes& sizes,
                                               Precision precision = Precision::kFp32);

}  // namespace parm::moe
