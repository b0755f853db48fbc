// The CUDA LayerBackend (moe/backend.h): the gate, dispatch, combine, their adjoints and the
// local data movement as the kernels of kernels/cuda/moe_kernels.h, the gate's two products
// on cuBLAS in fp32 (routing is fp32 at every precision), the experts on DeviceExperts.
// CUDA builds only.
//
// Everything is queued on the process's compute stream (kernels/cuda/runtime.h) without
// waiting, except: gate_forward copies the fill counts to the host at its end (fill() is
// host data), aux_loss / aux_loss_backward and routing() copy to and from the host, and with
// a non-null `times` the stream is synchronised before every phase lap so the phases are the
// GPU's time.
//
// Results against the CPU backend (moe_ops.h; tests/gpu/test_cuda_backend.cpp): routing
// (expert, row, fill, 1st-choice counts) identical for the same probabilities; softmax,
// top-k, combine weights, dispatch, combine and their adjoints the same bits where the CPU's
// own rounding is reproducible (see kernels/math/moe_math.h); probability sums, the gate
// products and what depends on them within fp32 summation-order error.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moe/backend.h"
#include "moe/cuda/device_experts.h"

namespace parm::moe {

class CudaBackend final : public LayerBackend {
 public:
  // Allocates every buffer once (device memory of the GPU of this process): the routing of
  // one gate call of up to sizes.gate_rows rows and k <= sizes.topk, and the experts'
  // workspace. Throws InvalidConfig without a GPU, parm::Error on bad sizes.
  CudaBackend(Precision precision, const BackendSizes& sizes);

  Device device() const override { return Device::kCuda; }
  Precision precision() const override { return precision_; }
  void set_weights_version(uint64_t version) override { experts_.set_weights_version(version); }

  void gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity,
                    int64_t slots, float* stats, PhaseTimes* times) override;
  const std::vector<int64_t>& fill() const override { return fill_host_; }
  const GateRouting& routing() override;
  void gate_backward(const Tensor& x, const Tensor& wg, const float* dstats, Tensor& dwg,
                     Tensor& dx, PhaseTimes* times) override;
  float aux_loss(const float* stats, int64_t experts, int64_t total_tokens,
                 int64_t sets) override;
  float z_loss(const float* stats, int64_t experts, int64_t total_tokens, int64_t sets) override;
  void aux_loss_backward(const float* stats, int64_t experts, int64_t total_tokens, int64_t sets,
                         float dl_aux, float dl_z, float* dstats) override;

  void dispatch_forward(const Tensor& x, Tensor& buf) override;
  void dispatch_backward(const Tensor& dbuf, Tensor& dx) override;
  void combine_forward(const Tensor& buf, Tensor& out) override;
  void combine_backward(const Tensor& buf, const Tensor& dout, Tensor& dbuf) override;

  // first (host; null: the (blocks, E_loc, slots) layout): the packed segments' starts.
  void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                       const int32_t* fills, const int64_t* first, bool add_b2, Tensor& out,
                       PhaseTimes* times) override;
  void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                        int64_t slots, const int32_t* fills, const int64_t* first,
                        ExpertShards& dw, Tensor& din, PhaseTimes* times) override;
  const std::vector<int64_t>& expert_rows() const override { return experts_.rows(); }
  double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim,
                                 int64_t hidden_shard, int reps) override;

  void take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk,
                  float* mine) override;
  void interleave(const float* parts, int64_t outer, int n, int64_t chunk,
                  float* full) override;
  void add(float* dst, const float* src, int64_t n) override;

  void sync() override;
  int64_t held_bytes() const override;

  // For checks: views of the device probabilities (rows, E) of the last gate_forward and
  // the combine-weight gradients (rows, k) of the last combine_backward.
  Tensor last_probs() const;
  // The local experts (for checks: what their CUDA graphs did).
  const cuda::DeviceExperts& device_experts() const { return experts_; }
  Tensor last_dweight() const;

 private:
  // Zero-filled device memory for `count` int32 values.
  struct DeviceInts {
    std::shared_ptr<int32_t> mem;
    int64_t count = 0;
    int32_t* data() const { return mem.get(); }
    int64_t bytes() const { return count * static_cast<int64_t>(sizeof(int32_t)); }
  };
  static DeviceInts device_ints(int64_t count);
  // Checks that the dispatch/combine calls follow a gate call and get tensors of its shape
  // (packed: a buffer of M-wide rows holding at least the routed ones).
  void check_routed(const Tensor& tokens, const Tensor& slots_buf, const char* what) const;

  Precision precision_;
  BackendSizes sizes_;
  // The last gate call: rows T, k, C and dispatch slots (valid once gated_).
  bool gated_ = false;
  bool have_dweight_ = false;  // a combine_backward ran after the last gate_forward
  int64_t rows_ = 0;
  int topk_ = 1;
  int64_t capacity_ = 0, slots_ = 0;
  // Device routing, sized for sizes.gate_rows (T) and sizes.topk (k):
  Tensor probs_;          // (T, E) softmax, kept for the backward pass
  Tensor dprobs_;         // (T, E) scratch of gate_backward
  Tensor prob_;           // (T, k) the chosen probabilities
  Tensor weight_;         // (T, k) combine weights
  Tensor dweight_;        // (T, k) from combine_backward
  DeviceInts expert_;     // (T, k) chosen experts
  DeviceInts row_;        // (T, k) dispatch-buffer rows, -1 dropped
  DeviceInts source_;     // (E, T) inverse map: choice index of each taken slot
  DeviceInts fill_;       // (E) slots taken
  DeviceInts first_;      // (E) packed layout: expert e's first dispatch row (moe_pack_routing)
  // Host copies.
  std::vector<int32_t> fill_host32_;  // (E)
  std::vector<int64_t> fill_host_;    // (E)
  std::vector<float> stats_host_, dstats_host_;  // (2E)
  GateRouting routing_host_;          // filled by routing()
  cuda::DeviceExperts experts_;
};

// PARM_CUDA_GRAPHS (0 / off, the default; 1 / on): whether the device experts run their
// steady-state passes from CUDA graphs (device_experts.h). Throws InvalidConfig on any other
// value.
bool cuda_graphs_from_env();

// The backend above behind the LayerBackend interface (make_backend calls it for cuda).
std::unique_ptr<LayerBackend> make_cuda_backend(Precision precision, const BackendSizes& sizes);

}  // namespace parm::moe
