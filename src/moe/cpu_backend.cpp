// The CPU backend of the MoE layer: moe_ops.h's functions over host tensors.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "moe/backend.h"
#include "moe/expert_products.h"
#include "moe/shared_experts.h"

namespace parm::moe {
namespace {

class CpuBackend final : public LayerBackend {
 public:
  CpuBackend(const BackendSizes& s, Precision p)
      : probs_({s.gate_rows, s.experts}), dprobs_({s.gate_rows, s.experts}),
        zero_unrouted_(!s.dropless), packed_(s.packed), z_loss_(s.z_loss) {
    cpu::stream_min_bytes();  // a bad PARM_STREAM_MIN_BYTES is refused here, before any work
    ws_.reserve(s.local_experts, s.max_expert_rows, s.model_dim, s.hidden_shard, p,
                s.max_local_rows, s.expert_mlp, s.acts_pool);
    if (s.shared_experts > 0)
      shared_.reserve(s.shared_experts, s.shared_rows, s.model_dim, s.shared_hidden_shard,
                      s.expert_mlp, s.shared_gate, p);
  }

  Device device() const override { return Device::kCpu; }
  Precision precision() const override { return ws_.precision; }

  void gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity,
                    int64_t slots, float* stats, PhaseTimes* times) override {
    moe::gate_forward(x, wg, topk, capacity, slots, probs_, routing_, stats, times, bias_,
                      router_, aux_rows_, aux_sets_, z_loss_);
    if (packed_) pack_routing(routing_);
  }
  void set_router_bias(const float* bias) override { bias_ = bias; }
  void set_router(const RouterSpec& router) override { router_ = router; }
  void set_aux_rows(const AuxRows& rows, int64_t sets) override {
    aux_rows_ = rows;
    aux_sets_ = sets;
  }
  void set_weights_version(uint64_t version) override {
    ws_.bf16.set_weights_version(version);
    shared_.bf16.set_weights_version(version);
  }
  WeightCopies weight_copies() const override {
    return {ws_.bf16.weight_packs(), ws_.bf16.last_pack_us()};
  }
  const std::vector<int64_t>& fill() const override { return routing_.fill; }
  const GateRouting& routing() override { return routing_; }
  void gate_backward(const Tensor& x, const Tensor& wg, const float* dstats, Tensor& dwg,
                     Tensor& dx, PhaseTimes* times) override {
    moe::gate_backward(x, wg, probs_, routing_, dweight_, dstats, dprobs_, dwg, dx, times);
  }
  float aux_loss(const float* stats, int64_t experts, int64_t total, int64_t sets) override {
    return moe::aux_loss(stats, experts, total, sets);
  }
  float z_loss(const float* stats, int64_t experts, int64_t total, int64_t sets) override {
    return moe::z_loss(stats, experts, total, sets);
  }
  void aux_loss_backward(const float* stats, int64_t experts, int64_t total, int64_t sets,
                         float dl_aux, float dl_z, float* dstats) override {
    moe::aux_loss_backward(stats, experts, total, dl_aux, dl_z, dstats, sets);
  }

  void dispatch_forward(const Tensor& x, Tensor& buf) override {
    moe::dispatch_forward(x, routing_, buf, zero_unrouted_);
  }
  void dispatch_backward(const Tensor& dbuf, Tensor& dx) override {
    moe::dispatch_backward(dbuf, routing_, dx);
  }
  void combine_forward(const Tensor& buf, Tensor& out) override {
    moe::combine_forward(buf, routing_, out);
  }
  void combine_backward(const Tensor& buf, const Tensor& dout, Tensor& dbuf) override {
    moe::combine_backward(buf, dout, routing_, dbuf, dweight_, zero_unrouted_);
  }

  void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                       const int32_t* fills, const int64_t* first, bool add_b2, Tensor& out,
                       PhaseTimes* times) override {
    moe::experts_forward(in, w, blocks, slots, fills, add_b2, ws_, out, times, first);
  }
  void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                        int64_t slots, const int32_t* fills, const int64_t* first,
                        ExpertShards& dw, Tensor& din, PhaseTimes* times) override {
    moe::experts_backward(dout, w, blocks, slots, fills, ws_, dw, din, times, first);
  }
  const std::vector<int64_t>& expert_rows() const override { return ws_.rows; }
  void shared_forward(const Tensor& x, const ExpertShards& w, const Tensor& gate_w, bool add_b2,
                      Tensor& out, PhaseTimes* times) override {
    moe::shared_forward(x, w, gate_w, add_b2, shared_, out, times);
  }
  void shared_backward(const Tensor& x, const Tensor& dout, const ExpertShards& w,
                       const Tensor& gate_w, ExpertShards& dw, Tensor& dgate_w, Tensor& dx,
                       PhaseTimes* times) override {
    moe::shared_backward(x, dout, w, gate_w, shared_, dw, dgate_w.data(), dx, times);
  }
  double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim,
                                 int64_t hidden_shard, int reps) override {
    return moe::time_expert_products_us(rows, model_dim, hidden_shard, reps, ws_.precision,
                                        ws_.mlp);
  }

  void take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk,
                  float* mine) override {
    // A copy of cpu::streamed size (the row exchanges' own block: 8 MiB for fine-grained
    // experts) is written past the cache: 1.7-2x faster than memcpy there, and what reads it
    // next reads it no slower (docs/fine-grained.md).
    if (cpu::streamed(outer * chunk * static_cast<int64_t>(sizeof(float)))) {
      for (int64_t o = 0; o < outer; ++o)
        cpu::copy_stream(mine + o * chunk, full + (o * n + j) * chunk, chunk);
      cpu::stream_fence();
      return;
    }
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(mine + o * chunk, full + (o * n + j) * chunk,
                  static_cast<size_t>(chunk) * sizeof(float));
  }
  void interleave(const float* parts, int64_t outer, int n, int64_t chunk,
                  float* full) override {
    for (int p = 0; p < n; ++p)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(full + (o * n + p) * chunk, parts + (p * outer + o) * chunk,
                    static_cast<size_t>(chunk) * sizeof(float));
  }
  void add(float* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  void sync() override {}
  int64_t held_bytes() const override {
    return probs_.bytes() + dprobs_.bytes() + ws_.held_bytes() + ws_.bf16.held_bytes() +
           shared_.held_bytes();
  }

 private:
  Tensor probs_, dprobs_;  // (gate rows, E)
  const float* bias_ = nullptr;  // the layer's router bias (E), or none
  RouterSpec router_;
  AuxRows aux_rows_;
  int64_t aux_sets_ = 1;
  GateRouting routing_;
  bool zero_unrouted_;  // not dropless (BackendSizes::dropless)
  bool packed_;         // BackendSizes::packed
  bool z_loss_;         // BackendSizes::z_loss
  std::vector<float> dweight_;
  ExpertWorkspace ws_;
  SharedWorkspace shared_;  // shared experts only
};

}  // namespace

std::unique_ptr<LayerBackend> make_cpu_backend(const BackendSizes& sizes, Precision precision) {
  return std::make_unique<CpuBackend>(sizes, precision);
}

}  // namespace parm::moe
