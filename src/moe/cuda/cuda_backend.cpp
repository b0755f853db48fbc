// The CUDA LayerBackend: checks shapes, owns the device routing, and queues the kernels of
// kernels/cuda/moe_kernels.h, the gate's cuBLAS products and DeviceExperts in the order of
// the CPU backend's functions (moe_ops.h).
#include "moe/cuda/cuda_backend.h"

#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_kernels.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"

namespace parm::moe {
namespace {

using parm::cuda::GemmType;

void sync_stream() { PARM_CUDA_CHECK(cudaStreamSynchronize(parm::cuda::stream())); }

// A PhaseClock of GPU time: with `times` set, waits for the queued work at the start and
// before every lap (without, it does nothing and never waits).
class GpuPhaseClock {
 public:
  explicit GpuPhaseClock(PhaseTimes* times) : clock_(started(times)), timing_(times != nullptr) {}
  void lap(const char* name) {
    if (!timing_) return;
    sync_stream();
    clock_.lap(name);
  }

 private:
  static PhaseTimes* started(PhaseTimes* times) {
    if (times != nullptr) sync_stream();
    return times;
  }
  PhaseClock clock_;
  bool timing_;
};

void check_on_gpu(const Tensor& t, const char* what) {
  PARM_CHECK(t.device() == Device::kCuda, "CUDA backend: {} {} is a {} tensor", what,
             shape_str(t.shape()), device_name(t.device()));
}

const BackendSizes& checked(const BackendSizes& s) {
  PARM_CHECK(s.gate_rows >= 0 && s.experts >= 1 && s.topk >= 1 && s.topk <= s.experts &&
                 s.model_dim >= 0,
             "CUDA backend: bad sizes: gate rows {}, E {}, k {}, M {}", s.gate_rows, s.experts,
             s.topk, s.model_dim);
  PARM_CHECK(s.gate_rows * s.topk <= INT32_MAX && s.gate_rows * s.experts <= INT32_MAX,
             "CUDA backend: gate rows {} x (k {}, E {}) overflow the int32 routing",
             s.gate_rows, s.topk, s.experts);
  check_expert_mlp(Device::kCuda, Precision::kFp32, s.expert_mlp);
  return s;
}

}  // namespace

CudaBackend::DeviceInts CudaBackend::device_ints(int64_t count) {
  auto* p = static_cast<int32_t*>(device_alloc(static_cast<size_t>(count) * sizeof(int32_t)));
  return {std::shared_ptr<int32_t>(p, [](int32_t* q) { device_free(q); }), count};
}

bool cuda_graphs_from_env() {
  const char* v = std::getenv("PARM_CUDA_GRAPHS");
  const std::string s = v != nullptr ? v : "";
  PARM_CONFIG_CHECK(s.empty() || s == "0" || s == "1" || s == "off" || s == "on",
                    "PARM_CUDA_GRAPHS={}: valid values are 0 or off (the default), 1 or on", s);
  return s == "1" || s == "on";
}

CudaBackend::CudaBackend(Precision precision, const BackendSizes& sizes)
    : precision_(precision),
      sizes_(checked(sizes)),
      probs_({sizes.gate_rows, sizes.experts}, Device::kCuda),
      dprobs_({sizes.gate_rows, sizes.experts}, Device::kCuda),
      prob_({sizes.gate_rows, sizes.topk}, Device::kCuda),
      weight_({sizes.gate_rows, sizes.topk}, Device::kCuda),
      dweight_({sizes.gate_rows, sizes.topk}, Device::kCuda),
      expert_(device_ints(sizes.gate_rows * sizes.topk)),
      row_(device_ints(sizes.gate_rows * sizes.topk)),
      source_(device_ints(sizes.experts * sizes.gate_rows)),
      fill_(device_ints(sizes.experts)),
      first_(device_ints(sizes.packed ? sizes.experts : 0)),
      fill_host32_(static_cast<size_t>(sizes.experts), 0),
      fill_host_(static_cast<size_t>(sizes.experts), 0),
      stats_host_(static_cast<size_t>(2 * sizes.experts), 0.0f),
      dstats_host_(static_cast<size_t>(2 * sizes.experts), 0.0f),
      experts_(sizes.local_experts, sizes.max_expert_rows, sizes.model_dim, sizes.hidden_shard,
               precision, sizes.max_local_rows) {
  experts_.set_graphs(cuda_graphs_from_env());
}

// ---- gate ----

void CudaBackend::gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity,
                               int64_t slots, float* stats, PhaseTimes* times) {
  check_on_gpu(x, "gate input");
  check_on_gpu(wg, "gate weights");
  const int64_t rows = x.rows(), M = x.cols(), E = wg.cols();
  PARM_CHECK_EQ(wg.rows(), M);
  PARM_CHECK(E == sizes_.experts && rows <= sizes_.gate_rows,
             "CUDA backend: gate call of {} rows x {} experts; sized for {} rows x {} experts",
             rows, E, sizes_.gate_rows, sizes_.experts);
  PARM_CHECK(topk >= 1 && topk <= sizes_.topk,
             "CUDA backend: top-k {} with {} experts (sized for k <= {})", topk, E, sizes_.topk);
  PARM_CHECK(capacity >= 0 && slots >= capacity, "dispatch slots {} below capacity {}", slots,
             capacity);
  gated_ = false;
  have_dweight_ = false;
  GpuPhaseClock clock(times);
  // Routing is fp32 at every precision.
  parm::cuda::gemm(false, false, rows, E, M, x.data(), wg.data(), probs_.data(), false,
                   GemmType::kF32);
  clock.lap("gate products");
  parm::cuda::moe_softmax(probs_.data(), probs_.data(), rows, E);
  clock.lap("softmax");
  parm::cuda::moe_topk_weights(probs_.data(), rows, E, topk, expert_.data(), prob_.data(),
                               weight_.data());
  clock.lap("top-k");
  parm::cuda::moe_slots_stats(expert_.data(), probs_.data(), rows, E, topk, capacity, slots,
                              row_.data(), source_.data(), fill_.data(), stats);
  // Dropless, packed: rows first[e] + slot (moe::pack_routing), first from the device fills.
  if (sizes_.packed)
    parm::cuda::moe_pack_routing(expert_.data(), fill_.data(), rows, topk, E, slots, row_.data(),
                                 first_.data());
  // fill() is host data: the one wait of the forward gate.
  cudaStream_t stream = parm::cuda::stream();
  PARM_CUDA_CHECK(cudaMemcpyAsync(fill_host32_.data(), fill_.data(),
                                  static_cast<size_t>(E) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream));
  PARM_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t e = 0; e < E; ++e)
    fill_host_[static_cast<size_t>(e)] = fill_host32_[static_cast<size_t>(e)];
  clock.lap("slots + statistics");
  rows_ = rows;
  topk_ = topk;
  capacity_ = capacity;
  slots_ = slots;
  gated_ = true;
}

const GateRouting& CudaBackend::routing() {
  PARM_CHECK(gated_, "CUDA backend: routing() before any gate_forward");
  GateRouting& r = routing_host_;
  r.tokens = rows_;
  r.experts = sizes_.experts;
  r.topk = topk_;
  r.capacity = capacity_;
  r.slots = slots_;
  const int64_t n = rows_ * topk_;
  const auto bytes = static_cast<size_t>(n) * sizeof(float);
  r.expert.resize(static_cast<size_t>(n));
  r.prob.resize(static_cast<size_t>(n));
  r.weight.resize(static_cast<size_t>(n));
  std::vector<int32_t> row32(static_cast<size_t>(n));
  device_copy(r.expert.data(), expert_.data(), bytes);
  device_copy(r.prob.data(), prob_.data(), bytes);
  device_copy(r.weight.data(), weight_.data(), bytes);
  device_copy(row32.data(), row_.data(), bytes);
  r.row.assign(row32.begin(), row32.end());
  r.fill = fill_host_;
  r.first.clear();
  if (sizes_.packed) {  // the device's starts, not the host's prefix sum: checks compare them
    std::vector<int32_t> first32(static_cast<size_t>(sizes_.experts));
    device_copy(first32.data(), first_.data(), first32.size() * sizeof(int32_t));
    r.first.assign(first32.begin(), first32.end());
  }
  return r;
}

void CudaBackend::gate_backward(const Tensor& x, const Tensor& wg, const float* dstats,
                                Tensor& dwg, Tensor& dx, PhaseTimes* times) {
  PARM_CHECK(gated_ && have_dweight_,
             "CUDA backend: gate_backward needs gate_forward and then combine_backward");
  check_on_gpu(x, "gate input");
  check_on_gpu(wg, "gate weights");
  check_on_gpu(dwg, "gate weight gradient");
  check_on_gpu(dx, "gate input gradient");
  const int64_t M = x.cols(), E = sizes_.experts;
  PARM_CHECK(x.rows() == rows_ && wg.rows() == M && wg.cols() == E,
             "CUDA backend: gate_backward with x {} and wg {} after a gate of {} rows x {} "
             "experts",
             shape_str(x.shape()), shape_str(wg.shape()), rows_, E);
  PARM_CHECK(dwg.numel() == M * E && dx.rows() == rows_ && dx.cols() == M,
             "CUDA backend: gate_backward gradients dwg {} dx {} for x {} and wg {}",
             shape_str(dwg.shape()), shape_str(dx.shape()), shape_str(x.shape()),
             shape_str(wg.shape()));
  GpuPhaseClock clock(times);
  parm::cuda::moe_weights_backward(expert_.data(), prob_.data(), dweight_.data(), dstats + E,
                                   rows_, E, topk_, dprobs_.data());
  clock.lap("top-k + weights backward");
  parm::cuda::moe_softmax_backward(probs_.data(), dprobs_.data(), dprobs_.data(), rows_, E);
  clock.lap("softmax backward");
  parm::cuda::gemm(true, false, M, E, rows_, x.data(), dprobs_.data(), dwg.data(), true,
                   GemmType::kF32);
  parm::cuda::gemm(false, true, rows_, M, E, dprobs_.data(), wg.data(), dx.data(), true,
                   GemmType::kF32);
  clock.lap("gate products");
}

float CudaBackend::aux_loss(const float* stats, int64_t experts, int64_t total_tokens,
                            int64_t sets) {
  // One set per gate call: set_aux_rows refuses the sequence-wise l_aux here.
  PARM_CHECK_EQ(sets, 1);
  stats_host_.resize(static_cast<size_t>(2 * experts + 1));
  device_copy(stats_host_.data(), stats, stats_host_.size() * sizeof(float));
  return moe::aux_loss(stats_host_.data(), experts, total_tokens);
}

// The device gate leaves the z-loss statistic alone (the layer refuses a z-loss here).
float CudaBackend::z_loss(const float*, int64_t, int64_t, int64_t) { return 0.0f; }

void CudaBackend::aux_loss_backward(const float* stats, int64_t experts, int64_t total_tokens,
                                    int64_t sets, float dl_aux, float dl_z, float* dstats) {
  PARM_CHECK_EQ(sets, 1);
  stats_host_.resize(static_cast<size_t>(2 * experts + 1));
  dstats_host_.resize(static_cast<size_t>(2 * experts + 1));
  device_copy(stats_host_.data(), stats, stats_host_.size() * sizeof(float));
  moe::aux_loss_backward(stats_host_.data(), experts, total_tokens, dl_aux, dl_z,
                         dstats_host_.data());
  device_copy(dstats, dstats_host_.data(), dstats_host_.size() * sizeof(float));
}

// ---- dispatch / combine ----

void CudaBackend::check_routed(const Tensor& tokens, const Tensor& slots_buf,
                               const char* what) const {
  PARM_CHECK(gated_, "CUDA backend: {} before any gate_forward", what);
  check_on_gpu(tokens, what);
  check_on_gpu(slots_buf, what);
  if (sizes_.packed) {
    int64_t routed = 0;
    for (int64_t f : fill_host_) routed += f;
    const int64_t M = tokens.cols();
    PARM_CHECK(tokens.rows() == rows_ && M > 0 && slots_buf.numel() % M == 0 &&
                   slots_buf.numel() / M >= routed,
               "CUDA backend: {} with tokens {} and buffer {} after a gate of {} rows that "
               "routed {} rows (packed: the buffer needs at least that many rows of {})",
               what, shape_str(tokens.shape()), shape_str(slots_buf.shape()), rows_, routed, M);
    return;
  }
  PARM_CHECK(tokens.rows() == rows_ && slots_buf.numel() == sizes_.experts * slots_ * tokens.cols(),
             "CUDA backend: {} with tokens {} and buffer {} after a gate of {} rows into {} x {} "
             "slots",
             what, shape_str(tokens.shape()), shape_str(slots_buf.shape()), rows_, sizes_.experts,
             slots_);
}

void CudaBackend::dispatch_forward(const Tensor& x, Tensor& buf) {
  check_routed(x, buf, "dispatch_forward");
  if (sizes_.packed) {
    parm::cuda::moe_scatter_choices(x.data(), row_.data(), nullptr, rows_, topk_, x.cols(),
                                    buf.data());
    return;
  }
  parm::cuda::moe_gather_slots(x.data(), source_.data(), fill_.data(), nullptr, rows_,
                               sizes_.experts, topk_, slots_, x.cols(), buf.data());
}

void CudaBackend::dispatch_backward(const Tensor& dbuf, Tensor& dx) {
  check_routed(dx, dbuf, "dispatch_backward");
  parm::cuda::moe_dispatch_backward(dbuf.data(), row_.data(), rows_, topk_, dx.cols(),
                                    dx.data());
}

void CudaBackend::combine_forward(const Tensor& buf, Tensor& out) {
  check_routed(out, buf, "combine_forward");
  parm::cuda::moe_combine_forward(buf.data(), row_.data(), weight_.data(), rows_, topk_,
                                  out.cols(), out.data());
}

void CudaBackend::combine_backward(const Tensor& buf, const Tensor& dout, Tensor& dbuf) {
  check_routed(dout, buf, "combine_backward");
  check_on_gpu(dbuf, "combine_backward dbuf");
  PARM_CHECK(dbuf.numel() == buf.numel(), "CUDA backend: combine_backward dbuf {} for buf {}",
             shape_str(dbuf.shape()), shape_str(buf.shape()));
  const int64_t M = dout.cols();
  if (sizes_.packed)
    parm::cuda::moe_scatter_choices(dout.data(), row_.data(), weight_.data(), rows_, topk_, M,
                                    dbuf.data());
  else
    parm::cuda::moe_gather_slots(dout.data(), source_.data(), fill_.data(), weight_.data(),
                                 rows_, sizes_.experts, topk_, slots_, M, dbuf.data());
  parm::cuda::moe_combine_dweight(buf.data(), dout.data(), row_.data(), rows_, topk_, M,
                                  dweight_.data());
  have_dweight_ = true;
}

// ---- experts ----

void CudaBackend::experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks,
                                  int64_t slots, const int32_t* fills, const int64_t* first,
                                  bool add_b2, Tensor& out, PhaseTimes* times) {
  experts_.forward(in, w, blocks, slots, fills, first, add_b2, out, times);
}

void CudaBackend::experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                                   int64_t slots, const int32_t* fills, const int64_t* first,
                                   ExpertShards& dw, Tensor& din, PhaseTimes* times) {
  experts_.backward(dout, w, blocks, slots, fills, first, dw, din, times);
}

double CudaBackend::time_expert_products_us(const std::vector<int64_t>& rows,
                                            int64_t model_dim, int64_t hidden_shard, int reps) {
  return cuda::time_expert_products_us(rows, model_dim, hidden_shard, reps, precision_);
}

// ---- local data movement ----

void CudaBackend::take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk,
                             float* mine) {
  parm::cuda::moe_take_chunk(full, outer, n, j, chunk, mine);
}

void CudaBackend::interleave(const float* parts, int64_t outer, int n, int64_t chunk,
                             float* full) {
  parm::cuda::moe_interleave(parts, outer, n, chunk, full);
}

void CudaBackend::add(float* dst, const float* src, int64_t n) {
  parm::cuda::moe_add(dst, src, n);
}

void CudaBackend::sync() { sync_stream(); }

Tensor CudaBackend::last_probs() const {
  PARM_CHECK(gated_, "CUDA backend: last_probs() before any gate_forward");
  return Tensor::view(const_cast<float*>(probs_.data()), {rows_, sizes_.experts}, Device::kCuda);
}

Tensor CudaBackend::last_dweight() const {
  PARM_CHECK(have_dweight_, "CUDA backend: last_dweight() before any combine_backward");
  return Tensor::view(const_cast<float*>(dweight_.data()), {rows_, topk_}, Device::kCuda);
}

int64_t CudaBackend::held_bytes() const {
  int64_t b = experts_.held_bytes();
  for (const Tensor* t : {&probs_, &dprobs_, &prob_, &weight_, &dweight_}) b += t->bytes();
  for (const DeviceInts* a : {&expert_, &row_, &source_, &fill_, &first_}) b += a->bytes();
  return b;
}

std::unique_ptr<LayerBackend> make_cuda_backend(Precision precision, const BackendSizes& sizes) {
  return std::make_unique<CudaBackend>(precision, sizes);
}

}  // namespace parm::moe
