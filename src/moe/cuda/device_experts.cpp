// The local experts on the GPU (see device_experts.h). The order of the work, and the phase
// each step is charged to, follow moe::experts_forward / experts_backward (experts.cpp), but
// every step runs for all experts at once: one gather, one grouped GEMM per product, the
// activation kernels expert by expert, one scatter.
#include "moe/cuda/device_experts.h"

#include <algorithm>
#include <array>

#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/runtime.h"
#include "moe/cuda/expert_rows.h"
#include "moe/expert_products.h"
#include "parm/error.h"
#include "parm/stats.h"

namespace parm::moe::cuda {

using parm::cuda::GemmProblem;
using parm::cuda::GemmType;
using parm::cuda::GroupedGemm;
using parm::cuda::SegmentCopy;

// Per expert e, the operands of the six products (expert_products.h) at
// base + e * stride: GEMM inputs in the operand type (fp32 or bf16, elem bytes each),
// outputs fp32. Row buffers are (max_rows, cols) per expert, weights (M, Hl) or (Hl, M).
struct ProductOperands {
  size_t elem = sizeof(float);
  const void* x = nullptr;     // (R, M)
  const void* w1 = nullptr;    // (M, Hl)
  const void* act = nullptr;   // (R, Hl)
  const void* w2 = nullptr;    // (Hl, M)
  const void* dy = nullptr;    // (R, M)
  const void* dpre = nullptr;  // (R, Hl)
  float* pre = nullptr;        // (R, Hl)
  float* out = nullptr;        // (R, M)
  float* dw2 = nullptr;        // (Hl, M) accumulated
  float* dact = nullptr;       // (R, Hl)
  float* dw1 = nullptr;        // (M, Hl) accumulated
  float* dx = nullptr;         // (R, M)
  int64_t rows_m_stride = 0;   // elements per expert of an (R, M) buffer: max_rows * M
  int64_t rows_h_stride = 0;   // of an (R, Hl) buffer: max_rows * Hl
  int64_t weight_stride = 0;   // of a weight: M * Hl
};

namespace {

GemmType gemm_type(Precision p) { return p == Precision::kBf16 ? GemmType::kBf16 : GemmType::kF32; }

const void* offset(const void* base, int64_t elements, size_t elem) {
  return static_cast<const char*>(base) + static_cast<size_t>(elements) * elem;
}

// Product p of every expert with rows (an expert with none has nothing to compute: its
// outputs have no rows and its weight gradients get nothing), in one grouped call.
void run_product(ExpertProduct p, const std::vector<int64_t>& rows, int64_t M, int64_t hl,
                 const ProductOperands& o, GemmType type, GroupedGemm& gemm,
                 std::vector<GemmProblem>& problems) {
  problems.clear();
  for (size_t e = 0; e < rows.size(); ++e) {
    const int64_t r = rows[e];
    if (r == 0) continue;
    const GemmCall g = expert_gemm(p, r, M, hl);
    const int64_t ei = static_cast<int64_t>(e);
    const int64_t rm = ei * o.rows_m_stride, rh = ei * o.rows_h_stride, w = ei * o.weight_stride;
    GemmProblem q;
    q.m = g.m;
    q.n = g.n;
    q.k = g.k;
    switch (p) {
      case ExpertProduct::kPre:
        q.a = offset(o.x, rm, o.elem), q.b = offset(o.w1, w, o.elem), q.c = o.pre + rh;
        break;
      case ExpertProduct::kOut:
        q.a = offset(o.act, rh, o.elem), q.b = offset(o.w2, w, o.elem), q.c = o.out + rm;
        break;
      case ExpertProduct::kDW2:
        q.a = offset(o.act, rh, o.elem), q.b = offset(o.dy, rm, o.elem), q.c = o.dw2 + w;
        break;
      case ExpertProduct::kDAct:
        q.a = offset(o.dy, rm, o.elem), q.b = offset(o.w2, w, o.elem), q.c = o.dact + rh;
        break;
      case ExpertProduct::kDW1:
        q.a = offset(o.x, rm, o.elem), q.b = offset(o.dpre, rh, o.elem), q.c = o.dw1 + w;
        break;
      case ExpertProduct::kDX:
        q.a = offset(o.dpre, rh, o.elem), q.b = offset(o.w1, w, o.elem), q.c = o.dx + rm;
        break;
    }
    problems.push_back(q);
  }
  const GemmCall flags = expert_gemm(p, 1, M, hl);  // the same for every row count
  gemm.run(flags.trans_a, flags.trans_b, flags.accumulate, type, problems.data(),
           static_cast<int64_t>(problems.size()));
}

// Segment copies, launched kMaxSegmentsPerLaunch at a time (no allocation).
class SegmentBatch {
 public:
  void add(const SegmentCopy& s) {
    buf_[static_cast<size_t>(n_++)] = s;
    if (n_ == parm::cuda::kMaxSegmentsPerLaunch) flush();
  }
  void flush() {
    if (n_ > 0) parm::cuda::copy_segments(buf_.data(), n_);
    n_ = 0;
  }

 private:
  std::array<SegmentCopy, parm::cuda::kMaxSegmentsPerLaunch> buf_{};
  int64_t n_ = 0;
};

void check_on_gpu(const Tensor& t, const char* name) {
  PARM_CHECK(t.device() == Device::kCuda, "device experts: {} {} is not on the GPU", name,
             shape_str(t.shape()));
}

}  // namespace

DeviceExperts::DeviceExperts(int64_t e_loc, int64_t max_rows, int64_t M, int64_t hl, Precision p)
    : e_loc_(e_loc),
      max_rows_(max_rows),
      model_dim_(M),
      hidden_(hl),
      precision_(p),
      gemm_(std::max<int64_t>(1, e_loc)) {
  PARM_CHECK(e_loc >= 1 && max_rows >= 0 && M >= 1 && hl >= 1,
             "DeviceExperts: bad sizes E_loc={} max_rows={} M={} Hl={}", e_loc, max_rows, M, hl);
  rows_.assign(static_cast<size_t>(e_loc), 0);
  problems_.reserve(static_cast<size_t>(e_loc));
  auto device = [this](Shape shape) {
    Tensor t(std::move(shape), Device::kCuda);
    held_bytes_ += t.bytes();
    return t;
  };
  in_ = device({e_loc, max_rows, M});
  pre_ = device({e_loc, max_rows, hl});
  act_ = device({e_loc, max_rows, hl});
  out_rows_ = device({e_loc, max_rows, M});
  d_out_ = device({e_loc, max_rows, M});
  d_act_ = device({e_loc, max_rows, hl});
  col_scratch_ = device(
      {std::max<int64_t>(1, parm::cuda::column_sum_scratch_floats(max_rows, std::max(M, hl)))});
  if (p == Precision::kBf16) {
    in_bf16_ = bf16_buffer(e_loc * max_rows * M);
    act_bf16_ = bf16_buffer(e_loc * max_rows * hl);
    d_out_bf16_ = bf16_buffer(e_loc * max_rows * M);
    d_pre_bf16_ = bf16_buffer(e_loc * max_rows * hl);
    w1_bf16_ = bf16_buffer(e_loc * M * hl);
    w2_bf16_ = bf16_buffer(e_loc * hl * M);
  }
  held_bytes_ += 3 * std::max<int64_t>(1, e_loc) * static_cast<int64_t>(sizeof(void*));
}

DeviceExperts::Bf16Buffer DeviceExperts::bf16_buffer(int64_t elements) {
  const size_t bytes = static_cast<size_t>(elements) * sizeof(uint16_t);
  held_bytes_ += static_cast<int64_t>(bytes);
  return Bf16Buffer{std::shared_ptr<void>(device_alloc(bytes), device_free)};
}

void DeviceExperts::check_call(const ExpertShards& w, const Tensor& a, const Tensor& b,
                               int64_t blocks, int64_t slots, const int32_t* fills,
                               const char* what) const {
  const int64_t M = model_dim_, hl = hidden_;
  PARM_CHECK(w.w1.ndim() == 3 && w.w1.dim(0) == e_loc_ && w.w1.dim(1) == M && w.w1.dim(2) == hl &&
                 w.b1.numel() == e_loc_ * hl && w.w2.numel() == e_loc_ * hl * M &&
                 w.b2.numel() == e_loc_ * M,
             "device experts {}: weights W1 {} b1 {} W2 {} b2 {} for E_loc={} M={} Hl={}", what,
             shape_str(w.w1.shape()), shape_str(w.b1.shape()), shape_str(w.w2.shape()),
             shape_str(w.b2.shape()), e_loc_, M, hl);
  for (const Tensor* t : {&w.w1, &w.b1, &w.w2, &w.b2}) check_on_gpu(*t, "weight");
  PARM_CHECK(blocks >= 0 && slots >= 0 && a.numel() == blocks * e_loc_ * slots * M &&
                 b.numel() == a.numel(),
             "device experts {}: buffers {} / {} for blocks={} E_loc={} slots={} M={}", what,
             shape_str(a.shape()), shape_str(b.shape()), blocks, e_loc_, slots, M);
  check_on_gpu(a, "buffer");
  check_on_gpu(b, "buffer");
  PARM_CHECK(blocks * slots <= max_rows_,
             "device experts {}: workspace sized for {} rows per expert, needs {} x {}", what,
             max_rows_, blocks, slots);
  PARM_CHECK(fills != nullptr || blocks == 0, "device experts {}: no fill counts", what);
  check_fills(fills, blocks, e_loc_, slots);
}

ProductOperands DeviceExperts::operands(const ExpertShards& w, ExpertShards* dw) {
  const bool bf16 = precision_ == Precision::kBf16;
  ProductOperands o;
  o.elem = bf16 ? sizeof(uint16_t) : sizeof(float);
  o.x = bf16 ? static_cast<const void*>(in_bf16_.data()) : in_.data();
  o.w1 = bf16 ? static_cast<const void*>(w1_bf16_.data()) : w.w1.data();
  o.act = bf16 ? static_cast<const void*>(act_bf16_.data()) : act_.data();
  o.w2 = bf16 ? static_cast<const void*>(w2_bf16_.data()) : w.w2.data();
  o.dy = bf16 ? static_cast<const void*>(d_out_bf16_.data()) : d_out_.data();
  o.dpre = bf16 ? static_cast<const void*>(d_pre_bf16_.data()) : d_act_.data();
  o.pre = pre_.data();
  o.out = out_rows_.data();
  o.dact = d_act_.data();
  o.dx = out_rows_.data();
  o.dw1 = dw != nullptr ? dw->w1.data() : nullptr;
  o.dw2 = dw != nullptr ? dw->w2.data() : nullptr;
  o.rows_m_stride = max_rows_ * model_dim_;
  o.rows_h_stride = max_rows_ * hidden_;
  o.weight_stride = model_dim_ * hidden_;
  return o;
}

void DeviceExperts::forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                            const int32_t* fills, bool add_b2, Tensor& out, PhaseTimes* times) {
  check_call(w, in, out, blocks, slots, fills, "forward");
  const int64_t M = model_dim_, hl = hidden_;
  const bool bf16 = precision_ == Precision::kBf16;
  const GemmType type = gemm_type(precision_);
  count_rows(fills, blocks, e_loc_, rows_);
  have_forward_ = true;
  if (times != nullptr) device_sync();  // earlier queued work is not this step's
  PhaseClock clock(times);
  auto lap = [&](const char* phase) {
    if (times == nullptr) return;
    device_sync();
    clock.lap(phase);
  };
  const ProductOperands o = operands(w, nullptr);
  SegmentBatch batch;
  auto add = [&](const SegmentCopy& s) { batch.add(s); };

  plan_gather(in.data(), blocks, e_loc_, slots, M, fills, in_.data(),
              bf16 ? in_bf16_.data() : nullptr, max_rows_ * M, add);
  batch.flush();
  lap("rows in/out");
  if (bf16) {  // once per forward pass; the backward pass reuses them
    parm::cuda::to_bf16(w.w1.data(), w1_bf16_.data(), e_loc_ * M * hl);
    parm::cuda::to_bf16(w.w2.data(), w2_bf16_.data(), e_loc_ * hl * M);
  }
  run_product(ExpertProduct::kPre, rows_, M, hl, o, type, gemm_, problems_);
  lap("expert products");
  for (int64_t e = 0; e < e_loc_; ++e) {
    const int64_t r = rows_[static_cast<size_t>(e)];
    parm::cuda::bias_gelu(pre_.data() + e * max_rows_ * hl, w.b1.data() + e * hl,
                          act_.data() + e * max_rows_ * hl,
                          bf16 ? act_bf16_.data() + e * max_rows_ * hl : nullptr, r, hl);
  }
  lap("bias + GeLU");
  run_product(ExpertProduct::kOut, rows_, M, hl, o, type, gemm_, problems_);
  lap("expert products");
  if (add_b2)
    for (int64_t e = 0; e < e_loc_; ++e)
      parm::cuda::add_bias(out_rows_.data() + e * max_rows_ * M, w.b2.data() + e * M,
                           rows_[static_cast<size_t>(e)], M);
  lap("bias + GeLU");
  plan_scatter(out_rows_.data(), max_rows_ * M, blocks, e_loc_, slots, M, fills, out.data(), add);
  batch.flush();
  lap("rows in/out");
}

void DeviceExperts::backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                             int64_t slots, const int32_t* fills, ExpertShards& dw, Tensor& din,
                             PhaseTimes* times) {
  check_call(w, dout, din, blocks, slots, fills, "backward");
  const int64_t M = model_dim_, hl = hidden_;
  PARM_CHECK(dw.w1.numel() == w.w1.numel() && dw.b1.numel() == w.b1.numel() &&
                 dw.w2.numel() == w.w2.numel() && dw.b2.numel() == w.b2.numel(),
             "device experts backward: gradients dW1 {} db1 {} dW2 {} db2 {} do not match the "
             "weights",
             shape_str(dw.w1.shape()), shape_str(dw.b1.shape()), shape_str(dw.w2.shape()),
             shape_str(dw.b2.shape()));
  for (const Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2}) check_on_gpu(*t, "gradient");
  PARM_CHECK(have_forward_, "device experts backward: no forward pass to differentiate");
  for (int64_t e = 0; e < e_loc_; ++e) {
    int64_t n = 0;
    for (int64_t b = 0; b < blocks; ++b) n += fills[b * e_loc_ + e];
    PARM_CHECK_EQ(n, rows_[static_cast<size_t>(e)]);
  }
  const bool bf16 = precision_ == Precision::kBf16;
  const GemmType type = gemm_type(precision_);
  if (times != nullptr) device_sync();
  PhaseClock clock(times);
  auto lap = [&](const char* phase) {
    if (times == nullptr) return;
    device_sync();
    clock.lap(phase);
  };
  const ProductOperands o = operands(w, &dw);
  SegmentBatch batch;
  auto add = [&](const SegmentCopy& s) { batch.add(s); };
  float* scratch = col_scratch_.data();

  plan_gather(dout.data(), blocks, e_loc_, slots, M, fills, d_out_.data(),
              bf16 ? d_out_bf16_.data() : nullptr, max_rows_ * M, add);
  batch.flush();
  lap("rows in/out");
  for (int64_t e = 0; e < e_loc_; ++e)
    parm::cuda::bias_backward(d_out_.data() + e * max_rows_ * M, dw.b2.data() + e * M, scratch,
                              rows_[static_cast<size_t>(e)], M);
  lap("GeLU + bias backward");
  run_product(ExpertProduct::kDW2, rows_, M, hl, o, type, gemm_, problems_);
  run_product(ExpertProduct::kDAct, rows_, M, hl, o, type, gemm_, problems_);
  lap("expert products");
  for (int64_t e = 0; e < e_loc_; ++e) {
    float* dact = d_act_.data() + e * max_rows_ * hl;
    parm::cuda::bias_gelu_backward(pre_.data() + e * max_rows_ * hl, w.b1.data() + e * hl, dact,
                                   dact, bf16 ? d_pre_bf16_.data() + e * max_rows_ * hl : nullptr,
                                   dw.b1.data() + e * hl, scratch, rows_[static_cast<size_t>(e)],
                                   hl);
  }
  lap("GeLU + bias backward");
  run_product(ExpertProduct::kDW1, rows_, M, hl, o, type, gemm_, problems_);
  run_product(ExpertProduct::kDX, rows_, M, hl, o, type, gemm_, problems_);
  lap("expert products");
  plan_scatter(out_rows_.data(), max_rows_ * M, blocks, e_loc_, slots, M, fills, din.data(), add);
  batch.flush();
  lap("rows in/out");
}

namespace {

// CUDA events destroyed on scope exit.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    PARM_CUDA_CHECK(cudaEventCreate(&start));
    PARM_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

double time_expert_products_us(const std::vector<int64_t>& rows, int64_t M, int64_t hl, int reps,
                               Precision p) {
  PARM_CHECK(!rows.empty() && reps >= 1 && M >= 1 && hl >= 1,
             "time_expert_products_us: {} experts, reps={}, M={}, Hl={}", rows.size(), reps, M, hl);
  const int64_t E = static_cast<int64_t>(rows.size());
  const int64_t r = std::max<int64_t>(1, *std::max_element(rows.begin(), rows.end()));
  const bool bf16 = p == Precision::kBf16;
  // Every expert has its own operands, as in the layer (the grouped call needs C apart).
  auto input = [](Shape shape) {
    Tensor t(std::move(shape), Device::kCuda);
    parm::cuda::fill_pattern(t.data(), t.numel());
    return t;
  };
  const Tensor x = input({E, r, M}), w1 = input({E, M, hl}), w2 = input({E, hl, M}),
               act = input({E, r, hl}), dy = input({E, r, M}), dpre = input({E, r, hl});
  Tensor pre({E, r, hl}, Device::kCuda), out({E, r, M}, Device::kCuda),
      dact({E, r, hl}, Device::kCuda), dx({E, r, M}, Device::kCuda), dw1({E, M, hl}, Device::kCuda),
      dw2({E, hl, M}, Device::kCuda);
  std::vector<std::shared_ptr<void>> bf16_copies;
  auto operand = [&](const Tensor& t) -> const void* {
    if (!bf16) return t.data();
    const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(uint16_t);
    bf16_copies.emplace_back(device_alloc(bytes), device_free);
    auto* h = static_cast<uint16_t*>(bf16_copies.back().get());
    parm::cuda::to_bf16(t.data(), h, t.numel());
    return h;
  };
  ProductOperands o;
  o.elem = bf16 ? sizeof(uint16_t) : sizeof(float);
  o.x = operand(x);
  o.w1 = operand(w1);
  o.act = operand(act);
  o.w2 = operand(w2);
  o.dy = operand(dy);
  o.dpre = operand(dpre);
  o.pre = pre.data();
  o.out = out.data();
  o.dact = dact.data();
  o.dx = dx.data();
  o.dw1 = dw1.data();
  o.dw2 = dw2.data();
  o.rows_m_stride = r * M;
  o.rows_h_stride = r * hl;
  o.weight_stride = M * hl;
  const GemmType type = gemm_type(p);
  GroupedGemm gemm(E);
  std::vector<GemmProblem> problems;
  problems.reserve(rows.size());
  EventPair events;
  cudaStream_t s = parm::cuda::stream();
  std::vector<double> totals;
  for (int i = 0; i < reps + 1; ++i) {  // one untimed round first
    PARM_CUDA_CHECK(cudaEventRecord(events.start, s));
    for (ExpertProduct q : kExpertProducts) run_product(q, rows, M, hl, o, type, gemm, problems);
    PARM_CUDA_CHECK(cudaEventRecord(events.stop, s));
    PARM_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0.0f;
    PARM_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    if (i > 0) totals.push_back(1000.0 * static_cast<double>(ms));
  }
  return median(totals);
}

}  // namespace parm::moe::cuda
