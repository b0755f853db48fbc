// The local experts on the GPU (see device_experts.h). The order of the work, and the phase
// each step is charged to, follow moe::experts_forward / experts_backward (experts.cpp), but
// every step runs for all experts at once: one gather, one grouped GEMM per product, one
// activation kernel (and its adjoint with the bias gradient), one scatter.
#include "moe/cuda/device_experts.h"

#include <algorithm>
#include <array>
#include <limits>

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

// Per expert e, the operands of the six products (expert_products.h): row buffers at
// base + rows_m_at[e] or rows_h_at[e] elements (expert_row_offsets), weights at
// base + e * weight_stride. GEMM inputs in the operand type (fp32 or bf16, in_elem bytes
// each), the row outputs (pre, out, dact, dx) in rows_type's output type, the weight
// gradients fp32. Row buffers hold (rows, cols) per expert, weights (M, Hl) or (Hl, M).
struct ProductOperands {
  GemmType rows_type = GemmType::kF32;    // pre, out, dact, dx: kF32 or kBf16ToBf16
  GemmType weight_type = GemmType::kF32;  // dW1, dW2 (fp32 C): kF32 or kBf16
  size_t in_elem = sizeof(float);
  const void* x = nullptr;     // (R, M)
  const void* w1 = nullptr;    // (M, Hl)
  const void* act = nullptr;   // (R, Hl)
  const void* w2 = nullptr;    // (Hl, M)
  const void* dy = nullptr;    // (R, M)
  const void* dpre = nullptr;  // (R, Hl)
  void* pre = nullptr;         // (R, Hl)
  void* out = nullptr;         // (R, M)
  float* dw2 = nullptr;        // (Hl, M) accumulated
  void* dact = nullptr;        // (R, Hl)
  float* dw1 = nullptr;        // (M, Hl) accumulated
  void* dx = nullptr;          // (R, M)
  const int64_t* rows_m_at = nullptr;  // (experts) expert e's first element, (R, M) buffers
  const int64_t* rows_h_at = nullptr;  // of (R, Hl) buffers
  int64_t weight_stride = 0;           // elements per expert of a weight: M * Hl
};

namespace {

const void* offset(const void* base, int64_t elements, size_t elem) {
  return static_cast<const char*>(base) + static_cast<size_t>(elements) * elem;
}
void* offset(void* base, int64_t elements, size_t elem) {
  return static_cast<char*>(base) + static_cast<size_t>(elements) * elem;
}

bool weight_gradient(ExpertProduct p) {
  return p == ExpertProduct::kDW1 || p == ExpertProduct::kDW2;
}

// Product p of every expert with rows (an expert with none has nothing to compute: its
// outputs have no rows and its weight gradients get nothing), in one grouped call.
void run_product(ExpertProduct p, const std::vector<int64_t>& rows, int64_t M, int64_t hl,
                 const ProductOperands& o, GroupedGemm& gemm, std::vector<GemmProblem>& problems) {
  const GemmType type = weight_gradient(p) ? o.weight_type : o.rows_type;
  const size_t in = o.in_elem, out = parm::cuda::output_bytes(type);
  problems.clear();
  for (size_t e = 0; e < rows.size(); ++e) {
    const int64_t r = rows[e];
    if (r == 0) continue;
    const GemmCall g = expert_gemm(p, r, M, hl);
    const int64_t ei = static_cast<int64_t>(e);
    const int64_t rm = o.rows_m_at[e], rh = o.rows_h_at[e], w = ei * o.weight_stride;
    GemmProblem q;
    q.m = g.m;
    q.n = g.n;
    q.k = g.k;
    switch (p) {
      case ExpertProduct::kPre:
        q.a = offset(o.x, rm, in), q.b = offset(o.w1, w, in), q.c = offset(o.pre, rh, out);
        break;
      case ExpertProduct::kOut:
        q.a = offset(o.act, rh, in), q.b = offset(o.w2, w, in), q.c = offset(o.out, rm, out);
        break;
      case ExpertProduct::kDW2:
        q.a = offset(o.act, rh, in), q.b = offset(o.dy, rm, in), q.c = o.dw2 + w;
        break;
      case ExpertProduct::kDAct:
        q.a = offset(o.dy, rm, in), q.b = offset(o.w2, w, in), q.c = offset(o.dact, rh, out);
        break;
      case ExpertProduct::kDW1:
        q.a = offset(o.x, rm, in), q.b = offset(o.dpre, rh, in), q.c = o.dw1 + w;
        break;
      case ExpertProduct::kDX:
        q.a = offset(o.dpre, rh, in), q.b = offset(o.w1, w, in), q.c = offset(o.dx, rm, out);
        break;
      case ExpertProduct::kGate:
      case ExpertProduct::kDW3:
      case ExpertProduct::kDXGate:
        // SwiGLU's third weight: the CUDA experts refuse swiglu before they are built
        // (moe::check_expert_mlp), so no product of it reaches here.
        PARM_CHECK(false, "the CUDA experts have no SwiGLU product ({})", static_cast<int>(p));
    }
    problems.push_back(q);
  }
  const GemmCall flags = expert_gemm(p, 1, M, hl);  // the same for every row count
  gemm.run(flags.trans_a, flags.trans_b, flags.accumulate, type, problems.data(),
           static_cast<int64_t>(problems.size()));
}

// The operand and output types of a precision.
void set_types(Precision p, ProductOperands& o) {
  const bool bf16 = p == Precision::kBf16;
  o.rows_type = bf16 ? GemmType::kBf16ToBf16 : GemmType::kF32;
  o.weight_type = bf16 ? GemmType::kBf16 : GemmType::kF32;
  o.in_elem = bf16 ? sizeof(uint16_t) : sizeof(float);
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

DeviceExperts::DeviceExperts(int64_t e_loc, int64_t max_rows, int64_t M, int64_t hl, Precision p,
                             int64_t max_total_rows)
    : e_loc_(e_loc),
      max_rows_(max_rows),
      model_dim_(M),
      hidden_(hl),
      max_total_rows_(max_total_rows),
      stride_m_(expert_block_stride(max_rows, M)),
      stride_h_(expert_block_stride(max_rows, hl)),
      elems_m_(max_total_rows > 0 ? expert_pool_elements(max_total_rows, e_loc, M)
                                  : e_loc * stride_m_),
      elems_h_(max_total_rows > 0 ? expert_pool_elements(max_total_rows, e_loc, hl)
                                  : e_loc * stride_h_),
      precision_(p),
      gemm_(std::max<int64_t>(1, e_loc)) {
  PARM_CHECK(e_loc >= 1 && max_rows >= 0 && M >= 1 && hl >= 1,
             "DeviceExperts: bad sizes E_loc={} max_rows={} M={} Hl={}", e_loc, max_rows, M, hl);
  PARM_CHECK(max_rows <= std::numeric_limits<int32_t>::max(),
             "DeviceExperts: {} rows per expert do not fit the kernels' int32 row counts", max_rows);
  PARM_CHECK(max_total_rows == 0 || max_total_rows >= max_rows,
             "DeviceExperts: a pool of {} rows for E_loc={} experts of up to {} rows each; it "
             "must hold at least {} (one expert may take every row), or be 0 (a block per expert)",
             max_total_rows, e_loc, max_rows, max_rows);
  rows_.assign(static_cast<size_t>(e_loc), 0);
  at_m_.assign(static_cast<size_t>(e_loc), 0);
  at_h_.assign(static_cast<size_t>(e_loc), 0);
  problems_.reserve(static_cast<size_t>(e_loc));
  auto device = [this](int64_t elements) {
    Tensor t({std::max<int64_t>(1, elements)}, Device::kCuda);
    held_bytes_ += t.bytes();
    return t;
  };
  const int64_t rows_m = elems_m_, rows_h = elems_h_;
  block_rows_.assign(static_cast<size_t>(e_loc), 0);
  block_at_.assign(static_cast<size_t>(e_loc), 0);
  const int64_t launch = std::min(e_loc, parm::cuda::kMaxExpertsPerLaunch);
  col_scratch_ = device(launch * parm::cuda::column_sum_scratch_floats(max_rows, std::max(M, hl)));
  if (p == Precision::kBf16) {
    in_bf16_ = bf16_buffer(rows_m);
    pre_bf16_ = bf16_buffer(rows_h);
    act_bf16_ = bf16_buffer(rows_h);
    out_bf16_ = bf16_buffer(rows_m);
    d_out_bf16_ = bf16_buffer(rows_m);
    d_act_bf16_ = bf16_buffer(rows_h);
    w1_bf16_ = bf16_buffer(e_loc * M * hl);
    w2_bf16_ = bf16_buffer(e_loc * hl * M);
  } else {
    in_ = device(rows_m);
    d_out_ = device(rows_m);
    pre_ = device(rows_h);
    act_ = device(rows_h);
    out_rows_ = device(rows_m);
    d_act_ = device(rows_h);
  }
  held_bytes_ += 3 * std::max<int64_t>(1, e_loc) * static_cast<int64_t>(sizeof(void*));
}

DeviceExperts::Bf16Buffer DeviceExperts::bf16_buffer(int64_t elements) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(1, elements)) * sizeof(uint16_t);
  held_bytes_ += static_cast<int64_t>(bytes);
  return Bf16Buffer{std::shared_ptr<void>(device_alloc(bytes), device_free)};
}

void DeviceExperts::check_call(const ExpertShards& w, const Tensor& a, const Tensor& b,
                               int64_t blocks, int64_t slots, const int32_t* fills,
                               const int64_t* first, const char* what) const {
  const int64_t M = model_dim_, hl = hidden_;
  PARM_CHECK(w.w1.ndim() == 3 && w.w1.dim(0) == e_loc_ && w.w1.dim(1) == M && w.w1.dim(2) == hl &&
                 w.b1.numel() == e_loc_ * hl && w.w2.numel() == e_loc_ * hl * M &&
                 w.b2.numel() == e_loc_ * M,
             "device experts {}: weights W1 {} b1 {} W2 {} b2 {} for E_loc={} M={} Hl={}", what,
             shape_str(w.w1.shape()), shape_str(w.b1.shape()), shape_str(w.w2.shape()),
             shape_str(w.b2.shape()), e_loc_, M, hl);
  for (const Tensor* t : {&w.w1, &w.b1, &w.w2, &w.b2}) check_on_gpu(*t, "weight");
  // Packed: the buffers hold the segments' rows back to back, at least the routed rows.
  PARM_CHECK(blocks >= 0 && slots >= 0 && b.numel() == a.numel() &&
                 (first != nullptr ? a.numel() % M == 0
                                   : a.numel() == blocks * e_loc_ * slots * M),
             "device experts {}: buffers {} / {} for blocks={} E_loc={} slots={} M={}{}", what,
             shape_str(a.shape()), shape_str(b.shape()), blocks, e_loc_, slots, M,
             first != nullptr ? " (packed rows)" : "");
  check_on_gpu(a, "buffer");
  check_on_gpu(b, "buffer");
  PARM_CHECK(blocks * slots <= max_rows_,
             "device experts {}: workspace sized for {} rows per expert, needs {} x {}", what,
             max_rows_, blocks, slots);
  PARM_CHECK(fills != nullptr || blocks == 0, "device experts {}: no fill counts", what);
  check_fills(fills, blocks, e_loc_, slots);
  if (first != nullptr) check_starts(fills, first, blocks * e_loc_, a.numel() / M);
}

void DeviceExperts::place_rows(const int32_t* fills, int64_t blocks, const char* what) {
  const bool pool = pooled();
  int64_t total = 0;
  for (int64_t i = 0; i < blocks * e_loc_; ++i) total += fills[i];
  PARM_CHECK(!pool || total <= max_total_rows_,
             "device experts {}: the fill counts give the {} local experts {} rows in all; the "
             "workspace pool holds {} (corrupt routing counts)",
             what, e_loc_, total, max_total_rows_);
  count_rows(fills, blocks, e_loc_, rows_);
  // Holds by the sizes (expert_pool_elements; blocks * slots <= max_rows): a broken offset
  // function stops here instead of writing past a buffer.
  const int64_t end_m =
      expert_row_offsets(rows_.data(), e_loc_, model_dim_, pool, stride_m_, at_m_.data());
  const int64_t end_h =
      expert_row_offsets(rows_.data(), e_loc_, hidden_, pool, stride_h_, at_h_.data());
  PARM_CHECK(end_m <= elems_m_ && end_h <= elems_h_,
             "device experts {}: the experts' rows end at element {} / {} of row buffers of {} / "
             "{} (M={}, Hl={})",
             what, end_m, end_h, elems_m_, elems_h_, model_dim_, hidden_);
}

parm::cuda::ExpertRows DeviceExperts::expert_rows(int64_t cols) const {
  parm::cuda::ExpertRows r;
  r.rows = rows_.data();
  r.experts = e_loc_;
  r.cols = cols;
  r.at = cols == model_dim_ ? at_m_.data() : at_h_.data();
  return r;
}

ProductOperands DeviceExperts::operands(const ExpertShards& w, ExpertShards* dw) {
  const bool bf16 = precision_ == Precision::kBf16;
  ProductOperands o;
  set_types(precision_, o);
  // Each operand's buffer at the precision (the bf16 one, or the fp32 one).
  auto pick = [bf16](void* b, void* f) { return bf16 ? b : f; };
  auto pick_in = [bf16](const void* b, const void* f) { return bf16 ? b : f; };
  o.x = pick_in(in_bf16_.data(), in_.data());
  o.w1 = pick_in(w1_bf16_.data(), w.w1.data());
  o.act = pick_in(act_bf16_.data(), act_.data());
  o.w2 = pick_in(w2_bf16_.data(), w.w2.data());
  o.dy = pick_in(d_out_bf16_.data(), d_out_.data());
  o.dpre = pick_in(d_act_bf16_.data(), d_act_.data());
  o.pre = pick(pre_bf16_.data(), pre_.data());
  o.out = pick(out_bf16_.data(), out_rows_.data());
  o.dact = pick(d_act_bf16_.data(), d_act_.data());
  o.dx = pick(out_bf16_.data(), out_rows_.data());
  o.dw1 = dw != nullptr ? dw->w1.data() : nullptr;
  o.dw2 = dw != nullptr ? dw->w2.data() : nullptr;
  o.rows_m_at = at_m_.data();
  o.rows_h_at = at_h_.data();
  o.weight_stride = model_dim_ * hidden_;
  return o;
}

void DeviceExperts::set_graphs(bool on) {
  fwd_policy_.set_enabled(on);
  bwd_policy_.set_enabled(on);
  if (!on) {
    fwd_graph_.reset();
    bwd_graph_.reset();
  }
}

namespace {

// key = the pass's tensors, sizes, fills and the packed segments' starts (first, when not
// null: the copies' addresses are made of them) (pass_graphs.h); overwritten. Where each
// expert's rows sit in a pooled workspace follows from the fills (expert_row_offsets), so
// the fills cover it.
void make_key(PassKey& key, std::initializer_list<const Tensor*> tensors,
              std::initializer_list<int64_t> sizes, const int32_t* fills, const int64_t* first,
              int64_t num_fills) {
  key.clear();
  for (const Tensor* t : tensors) key.pointers.push_back(t->data());
  key.sizes.assign(sizes.begin(), sizes.end());
  key.sizes.push_back(first != nullptr ? 1 : 0);
  if (first != nullptr) key.sizes.insert(key.sizes.end(), first, first + num_fills);
  key.fills.assign(fills, fills + num_fills);
}

}  // namespace

void DeviceExperts::run_pass(GraphPolicy& policy, parm::cuda::StreamGraph& graph,
                             const std::function<void()>& work) {
  switch (policy.next(key_)) {
    case GraphPolicy::Action::kReplay:
      graph.launch();
      return;
    case GraphPolicy::Action::kCapture: {
      const bool ok = graph.capture(work);
      policy.captured(ok);
      if (ok) {
        graph.launch();
        return;
      }
      break;  // run it eagerly
    }
    case GraphPolicy::Action::kEager:
      break;
  }
  work();
}

void DeviceExperts::forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                            const int32_t* fills, const int64_t* first, bool add_b2, Tensor& out,
                            PhaseTimes* times) {
  check_call(w, in, out, blocks, slots, fills, first, "forward");
  place_rows(fills, blocks, "forward");
  have_forward_ = true;
  const bool convert =
      precision_ == Precision::kBf16 && weight_copies_.stale(w.w1.data(), w.w2.data());
  if (times != nullptr || !fwd_policy_.enabled()) {
    forward_work(in, w, blocks, slots, fills, first, add_b2, convert, out, times);
    return;
  }
  // Outside the pass's graph: a replay must not round the weights again when they are the
  // same, nor skip it when they changed.
  if (convert) convert_weights(w);
  make_key(key_, {&in, &out, &w.w1, &w.b1, &w.w2, &w.b2},
           {blocks, slots, add_b2 ? 1 : 0, static_cast<int64_t>(gemm_.mode())}, fills, first,
           blocks * e_loc_);
  run_pass(fwd_policy_, fwd_graph_, [&] {
    forward_work(in, w, blocks, slots, fills, first, add_b2, false, out, nullptr);
  });
}

void DeviceExperts::convert_weights(const ExpertShards& w) {
  const int64_t M = model_dim_, hl = hidden_;
  parm::cuda::to_bf16(w.w1.data(), w1_bf16_.data(), e_loc_ * M * hl);
  parm::cuda::to_bf16(w.w2.data(), w2_bf16_.data(), e_loc_ * hl * M);
  weight_copies_.made(w.w1.data(), w.w2.data());
}

void DeviceExperts::forward_work(const Tensor& in, const ExpertShards& w, int64_t blocks,
                                 int64_t slots, const int32_t* fills, const int64_t* first,
                                 bool add_b2, bool convert, Tensor& out, PhaseTimes* times) {
  const int64_t M = model_dim_, hl = hidden_;
  const bool bf16 = precision_ == Precision::kBf16;
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

  // Straight into the grouped products' row layout, in their operand type.
  plan_gather(in.data(), blocks, e_loc_, slots, M, fills, first, bf16 ? nullptr : in_.data(),
              bf16 ? in_bf16_.data() : nullptr, at_m_.data(), add);
  batch.flush();
  lap("rows in/out");
  if (convert) convert_weights(w);  // when they changed; the backward pass reuses them
  run_product(ExpertProduct::kPre, rows_, M, hl, o, gemm_, problems_);
  lap("expert products");
  if (bf16)
    parm::cuda::bias_gelu(parm::cuda::bf16_values(pre_bf16_.data()), w.b1.data(), nullptr,
                          act_bf16_.data(), expert_rows(hl));
  else
    parm::cuda::bias_gelu(parm::cuda::f32_values(pre_.data()), w.b1.data(), act_.data(), nullptr,
                          expert_rows(hl));
  lap("bias + GeLU");
  run_product(ExpertProduct::kOut, rows_, M, hl, o, gemm_, problems_);
  lap("expert products");
  // The scatter adds b2 (fp32) to each output row on its way out.
  plan_scatter(bf16 ? nullptr : out_rows_.data(), bf16 ? out_bf16_.data() : nullptr,
               at_m_.data(), add_b2 ? w.b2.data() : nullptr, blocks, e_loc_, slots, M, fills,
               first, out.data(), add);
  batch.flush();
  lap("rows in/out");
}

void DeviceExperts::backward(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                             int64_t slots, const int32_t* fills, const int64_t* first,
                             ExpertShards& dw, Tensor& din, PhaseTimes* times) {
  check_call(w, dout, din, blocks, slots, fills, first, "backward");
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
  if (times != nullptr || !bwd_policy_.enabled()) {
    backward_work(dout, w, blocks, slots, fills, first, dw, din, times);
    return;
  }
  make_key(key_, {&dout, &din, &w.w1, &w.b1, &w.w2, &w.b2, &dw.w1, &dw.b1, &dw.w2, &dw.b2},
           {blocks, slots, static_cast<int64_t>(gemm_.mode())}, fills, first, blocks * e_loc_);
  run_pass(bwd_policy_, bwd_graph_,
           [&] { backward_work(dout, w, blocks, slots, fills, first, dw, din, nullptr); });
}

void DeviceExperts::backward_work(const Tensor& dout, const ExpertShards& w, int64_t blocks,
                                  int64_t slots, const int32_t* fills, const int64_t* first,
                                  ExpertShards& dw, Tensor& din, PhaseTimes* times) {
  const int64_t M = model_dim_, hl = hidden_;
  const bool bf16 = precision_ == Precision::kBf16;
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

  // Straight into the products' row layout, in their operand type.
  plan_gather(dout.data(), blocks, e_loc_, slots, M, fills, first, bf16 ? nullptr : d_out_.data(),
              bf16 ? d_out_bf16_.data() : nullptr, at_m_.data(), add);
  batch.flush();
  lap("rows in/out");
  // db2 from the exchange layout itself (fp32 at every precision), one call per block: in
  // block b expert e's filled rows are the first fills[b * E_loc + e] rows of segment [b, e],
  // at segment_offset (either layout).
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t e = 0; e < e_loc_; ++e) {
      block_rows_[static_cast<size_t>(e)] = fills[b * e_loc_ + e];
      block_at_[static_cast<size_t>(e)] = segment_offset(b, e, e_loc_, slots, M, first);
    }
    parm::cuda::ExpertRows r;
    r.rows = block_rows_.data();
    r.experts = e_loc_;
    r.cols = M;
    r.at = block_at_.data();
    parm::cuda::bias_backward(dout.data(), dw.b2.data(), scratch, r);
  }
  lap("GeLU + bias backward");
  run_product(ExpertProduct::kDW2, rows_, M, hl, o, gemm_, problems_);
  run_product(ExpertProduct::kDAct, rows_, M, hl, o, gemm_, problems_);
  lap("expert products");
  // dpre in place of dact (each element read, then written, by the same thread).
  if (bf16)
    parm::cuda::bias_gelu_backward(parm::cuda::bf16_values(pre_bf16_.data()), w.b1.data(),
                                   parm::cuda::bf16_values(d_act_bf16_.data()), nullptr,
                                   d_act_bf16_.data(), dw.b1.data(), scratch, expert_rows(hl));
  else
    parm::cuda::bias_gelu_backward(parm::cuda::f32_values(pre_.data()), w.b1.data(),
                                   parm::cuda::f32_values(d_act_.data()), d_act_.data(), nullptr,
                                   dw.b1.data(), scratch, expert_rows(hl));
  lap("GeLU + bias backward");
  run_product(ExpertProduct::kDW1, rows_, M, hl, o, gemm_, problems_);
  run_product(ExpertProduct::kDX, rows_, M, hl, o, gemm_, problems_);
  lap("expert products");
  plan_scatter(bf16 ? nullptr : out_rows_.data(), bf16 ? out_bf16_.data() : nullptr,
               at_m_.data(), nullptr, blocks, e_loc_, slots, M, fills, first, din.data(), add);
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
  ProductOperands o;
  set_types(p, o);
  std::vector<int64_t> at_m(rows.size()), at_h(rows.size());
  const int64_t rows_m = expert_row_offsets(rows.data(), E, M, false,
                                            expert_block_stride(r, M), at_m.data());
  const int64_t rows_h = expert_row_offsets(rows.data(), E, hl, false,
                                            expert_block_stride(r, hl), at_h.data());
  o.rows_m_at = at_m.data();
  o.rows_h_at = at_h.data();
  o.weight_stride = M * hl;
  // Every expert has its own operands, as in the layer (the grouped call needs C apart), in
  // the layer's types: inputs filled with a pattern (rounded to bf16 at Precision::kBf16).
  std::vector<std::shared_ptr<void>> held;
  auto buffer = [&](int64_t elements, size_t elem) -> void* {
    held.emplace_back(device_alloc(static_cast<size_t>(elements) * elem), device_free);
    return held.back().get();
  };
  auto input = [&](int64_t elements) -> const void* {
    auto* f = static_cast<float*>(buffer(elements, sizeof(float)));  // kept: queued work reads it
    parm::cuda::fill_pattern(f, elements);
    if (!bf16) return f;
    auto* h = static_cast<uint16_t*>(buffer(elements, sizeof(uint16_t)));
    parm::cuda::to_bf16(f, h, elements);
    return h;
  };
  const int64_t wts = E * M * hl;
  o.x = input(rows_m);
  o.w1 = input(wts);
  o.act = input(rows_h);
  o.w2 = input(wts);
  o.dy = input(rows_m);
  o.dpre = input(rows_h);
  const size_t out = parm::cuda::output_bytes(o.rows_type);
  o.pre = buffer(rows_h, out);
  o.out = buffer(rows_m, out);
  o.dact = buffer(rows_h, out);
  o.dx = buffer(rows_m, out);
  o.dw1 = static_cast<float*>(buffer(wts, sizeof(float)));
  o.dw2 = static_cast<float*>(buffer(wts, sizeof(float)));
  GroupedGemm gemm(E);
  std::vector<GemmProblem> problems;
  problems.reserve(rows.size());
  EventPair events;
  cudaStream_t s = parm::cuda::stream();
  std::vector<double> totals;
  for (int i = 0; i < reps + 1; ++i) {  // one untimed round first
    PARM_CUDA_CHECK(cudaEventRecord(events.start, s));
    for (ExpertProduct q : kExpertProducts) run_product(q, rows, M, hl, o, gemm, problems);
    PARM_CUDA_CHECK(cudaEventRecord(events.stop, s));
    PARM_CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0.0f;
    PARM_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    if (i > 0) totals.push_back(1000.0 * static_cast<double>(ms));
  }
  return median(totals);
}

}  // namespace parm::moe::cuda
