// The executor: runs a schedule's step list forward, and its adjoint in reverse order.
#include "moe/moe_layer.h"

#include <algorithm>
#include <cstring>

#include "comm/fused_any.h"
#include "shape/packed_rows.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

using schedule::Move;
using schedule::Step;
using schedule::StepKind;

namespace {

// The local copies and sums of the dropless exchanges, on the layer's backend.
class BackendRowOps final : public RowOps {
 public:
  explicit BackendRowOps(moe::LayerBackend& b) : b_(b) {}
  void copy(float* dst, const float* src, int64_t n) override {
    if (n > 0) b_.take_chunk(src, 1, 1, 0, n, dst);
  }
  void add(float* dst, const float* src, int64_t n) override {
    if (n > 0) b_.add(dst, src, n);
  }
  void sync() override { b_.sync(); }

 private:
  moe::LayerBackend& b_;
};

MoeLayerParams make_params(const MoeShape& shape, int64_t e_loc, int64_t hl, Device d) {
  const int64_t M = shape.model_dim, E = shape.experts;
  MoeLayerParams p;
  p.wg = Tensor({M, E}, d);
  p.experts.w1 = Tensor({e_loc, M, hl}, d);
  p.experts.b1 = Tensor({e_loc, hl}, d);
  p.experts.w2 = Tensor({e_loc, hl, M}, d);
  p.experts.b2 = Tensor({e_loc, M}, d);
  return p;
}

}  // namespace

void copy_params(const MoeLayerParams& from, MoeLayerParams& to) {
  to.wg.copy_from(from.wg);
  to.experts.w1.copy_from(from.experts.w1);
  to.experts.b1.copy_from(from.experts.b1);
  to.experts.w2.copy_from(from.experts.w2);
  to.experts.b2.copy_from(from.experts.b2);
}

MoeLayerParams params_on(const MoeLayerParams& p, Device device) {
  return {p.wg.to(device),
          {p.experts.w1.to(device), p.experts.b1.to(device), p.experts.w2.to(device),
           p.experts.b2.to(device)}};
}

MoeLayer::MoeLayer(Topology& topo, const MoeShape& shape, schedule::Kind kind, bool fuse,
                   int chunks, Precision precision, bool router_z_loss)
    : topo_(topo), shape_(shape), router_bias_(std::make_shared<std::vector<float>>(static_cast<size_t>(shape.experts), 0.0f)) {
  const Layout& l = topo.layout();
  const Device device = topo.device();
  esp_rank_ = topo.comm(Group::kEsp).rank();
  esp_size_ = l.esp;
  PARM_CONFIG_CHECK(!router_z_loss || device == Device::kCpu,
                    "the router z-loss runs on the CPU only, this MoE layer is on {}; use "
                    "router_z_loss 0 there", device_name(device));
  // Dropless buffers packed (sized by the rows routed) on every backend (docs/dropless.md).
  const bool packed = true;
  schedule_ =
      schedule::build({shape, l, esp_rank_, fuse, chunks, router_z_loss, packed}, kind);
  const int64_t M = shape.model_dim, E = shape.experts;
  const int64_t e_loc = E / l.ep, hl = shape.hidden / l.esp;
  first_expert_ = static_cast<int>(topo.comm(Group::kEp).rank() * e_loc);
  moe::BackendSizes sizes;
  sizes.gate_rows = schedule_.gate_tokens;
  sizes.experts = E;
  sizes.topk = shape.topk;
  sizes.model_dim = M;
  sizes.local_experts = e_loc;
  sizes.hidden_shard = hl;
  sizes.max_expert_rows = schedule_.expert_blocks * schedule_.exchange_slots;
  sizes.dropless = schedule_.dropless;
  sizes.packed = schedule_.packed;
  if (schedule_.dropless)
    sizes.max_local_rows = schedule::dropless_local_rows(schedule_, shape.topk, e_loc);
  backend_ = moe::make_backend(device, precision, sizes);
  params_ = make_params(shape, e_loc, hl, device);
  grads_ = make_params(shape, e_loc, hl, device);
  dwg_call_ = Tensor({M, E}, device);
  // The backends write the statistics as 2E + 1 values (the z-loss sum last) and their
  // gradient likewise: without the z-loss the step buffer is a view of the first 2E of them.
  int stats = -1;
  for (const Step& s : schedule_.steps)
    if (s.kind == StepKind::kGate) stats = s.out;
  for (size_t i = 0; i < schedule_.buffers.size(); ++i) {
    const Shape& shape_i = schedule_.buffers[i].shape;
    if (static_cast<int>(i) == stats && !schedule_.z_loss) {
      const int64_t n = schedule::stats_numel(E, false);
      bufs_.push_back(Tensor({n + 1}, device).slice_rows(0, n));
      dbufs_.push_back(Tensor({n + 1}, device).slice_rows(0, n));
      continue;
    }
    // Packed: the rows routed at most, back to back (docs/dropless.md).
    const int64_t packed_rows = schedule_.packed ? schedule_.buffers[i].max_routed_rows : 0;
    const Shape held = packed_rows > 0 ? Shape{packed_rows, M} : shape_i;
    bufs_.emplace_back(held, device);
    dbufs_.emplace_back(held, device);
  }
  const size_t num_steps = schedule_.steps.size();
  fwd_us_.assign(num_steps, 0.0);
  bwd_us_.assign(num_steps, 0.0);
  fwd_phases_.assign(num_steps, {});
  bwd_phases_.assign(num_steps, {});
  accumulated_ = schedule::accumulated_gradients(schedule_);
  fills_.assign(schedule_.buffers.size(), {});
  firsts_.assign(schedule_.buffers.size(), {});
  // The interleaving allgathers' scratch: the largest destination of one (a dropless move of
  // segmented buffers is a row exchange, which needs none).
  int64_t scratch = 0;
  for (const Step& s : schedule_.steps)
    for (bool backward : {false, true})
      if (schedule::step_move(s.kind, backward) == Move::kAllGather && s.outer > 1 &&
          !dropless_move(s))
        scratch = std::max(scratch, bufs_[static_cast<size_t>(backward ? s.in : s.out)].numel());
  if (scratch > 0) gather_scratch_ = Tensor({scratch}, device);
  // Dropless reductions receive every peer's routed rows of a buffer in the experts' layout
  // (blocks of E_loc segments): at most its max_routed_rows (docs/dropless.md, "Worst case
  // per buffer"). A reduce-scatter receives n - 1 peers' rows of its destination, an
  // all-reduce n of its buffer, a fused combine N_ESP of its source's part (its source over
  // N_ESP). The row exchanges' packing buffers are sized here too, as their first call would.
  int64_t rows_scratch = 0;
  if (schedule_.dropless) {
    const auto routed_elems = [&](int id) {  // at most, of buffer id
      return schedule_.buffers[static_cast<size_t>(id)].max_routed_rows * M;
    };
    const auto segments_of = [&](int id) {
      const auto& b = schedule_.buffers[static_cast<size_t>(id)];
      return shape_numel(b.shape) / (b.slots * M);
    };
    for (const Step& s : schedule_.steps)
      for (bool backward : {false, true}) {
        const Move m = schedule::step_move(s.kind, backward);
        Communicator& c = topo_.comm(s.group);
        const int64_t n = c.size();
        if (m == Move::kReduceScatter && segmented(s.in))
          rows_scratch = std::max(rows_scratch, routed_elems(backward ? s.in : s.out) * (n - 1));
        if (m == Move::kAllReduce && segmented(s.in))
          rows_scratch = std::max(rows_scratch, routed_elems(backward ? s.in : s.out) * n);
        if (m == Move::kFusedCombine)
          rows_scratch = std::max(rows_scratch, routed_elems(backward ? s.out : s.in));
        const CommOp op = m == Move::kAllToAll        ? CommOp::kAllToAllv
                          : m == Move::kAllGather     ? CommOp::kAllGather
                          : m == Move::kReduceScatter ? CommOp::kReduceScatter
                          : m == Move::kAllReduce     ? CommOp::kAllReduce
                                                      : CommOp::kMetadata;
        if (op != CommOp::kMetadata && dropless_move(s))
          rows_.reserve_packing(c, RowExchange::ranges_per_peer(
                                       op, segments_of(backward ? s.out : s.in),
                                       segments_of(backward ? s.in : s.out), c.size()));
      }
  }
  if (rows_scratch > 0) row_scratch_ = Tensor({rows_scratch}, device);
}

int64_t MoeLayer::held_bytes() const {
  int64_t b = 0;
  for (const MoeLayerParams* p : {&params_, &grads_})
    b += p->wg.bytes() + p->experts.w1.bytes() + p->experts.b1.bytes() +
         p->experts.w2.bytes() + p->experts.b2.bytes();
  for (const auto* list : {&bufs_, &dbufs_})
    for (const Tensor& t : *list) b += t.bytes();
  return b + dwg_call_.bytes() + gather_scratch_.bytes() + row_scratch_.bytes() +
         rows_.held_bytes() + backend_->held_bytes();
}

void MoeLayer::slice_fills(const Step& s) {
  // S2's "keep my slots": MP rank j keeps slots [j*cs, (j+1)*cs) of every expert, so its
  // fill is the part of the expert's filled prefix that falls there.
  // Dropless: MP rank j keeps part j of every expert's routed rows (dropless_part), so the
  // ranks share the rows evenly.
  const auto& in = fills(s.in);
  auto& out = fills(s.out);
  const int64_t cs = s.chunk / shape_.model_dim;
  Communicator& c = topo_.comm(s.group);
  const int64_t lo = c.rank() * cs;
  out.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = static_cast<int32_t>(
        schedule_.dropless ? schedule::dropless_part(in[i], c.rank(), c.size()).rows
                           : std::clamp<int64_t>(in[i] - lo, 0, cs));
}

void MoeLayer::post_fills(Group g, bool gather, const std::vector<int32_t>& in,
                          std::vector<int32_t>& out) {
  Communicator& c = topo_.host_comm(g);  // the counts are host memory on every device
  const size_t n = in.size(), size = static_cast<size_t>(c.size());
  PARM_CHECK(n > 0, "fill counts to exchange over {} are missing", c.name());
  if (gather) {
    out.resize(n * size);
    meta_.post_allgather(c, in.data(), out.data(), n);
  } else {
    out.resize(n);
    meta_.post_alltoall(c, in.data(), out.data(), n / size);
  }
}

void MoeLayer::gather_interleaved(Communicator& c, const Tensor& mine, int64_t outer,
                                  int64_t chunk, Tensor& full) {
  if (outer == 1) {
    c.allgather(mine.data(), full.data(), static_cast<size_t>(chunk));
    return;
  }
  PARM_CHECK(gather_scratch_.numel() >= full.numel(),
             "interleaved allgather into {} elements, scratch sized {} at construction",
             full.numel(), gather_scratch_.numel());
  // (n, outer, chunk) blocks, then interleaved into (outer, n, chunk).
  c.allgather(mine.data(), gather_scratch_.data(), static_cast<size_t>(outer * chunk));
  backend_->interleave(gather_scratch_.data(), outer, c.size(), chunk, full.data());
}

void MoeLayer::keep_chunk(Communicator& c, int64_t outer, const Tensor& full, Tensor& mine) {
  backend_->take_chunk(full.data(), outer, c.size(), c.rank(), mine.numel() / outer,
                       mine.data());
}

void MoeLayer::load_whole(const ref::MoeParams<float>& whole) {
  whole.check(shape_);
  const int64_t hl_shard = params_.experts.w1.dim(2);
  MoeLayerParams host = make_params(shape_, params_.experts.w1.dim(0), hl_shard, Device::kCpu);
  std::memcpy(host.wg.data(), whole.wg.data(), static_cast<size_t>(host.wg.bytes()));
  auto& x = host.experts;
  const int64_t e_loc = x.w1.dim(0), M = shape_.model_dim, hl = x.w1.dim(2);
  for (int64_t e = 0; e < e_loc; ++e) {
    const auto part = ref::slice_expert(shape_, whole, first_expert_ + e, esp_rank_, esp_size_);
    std::memcpy(x.w1.data() + e * M * hl, part.w1.data(), part.w1.size() * sizeof(float));
    std::memcpy(x.b1.data() + e * hl, part.b1.data(), part.b1.size() * sizeof(float));
    std::memcpy(x.w2.data() + e * hl * M, part.w2.data(), part.w2.size() * sizeof(float));
    std::memcpy(x.b2.data() + e * M, whole.b2.data() + (first_expert_ + e) * M,
                static_cast<size_t>(M) * sizeof(float));
  }
  copy_params(host, params_);
}

void MoeLayer::store_whole_grads(ref::MoeParams<float>& whole) const {
  whole.check(shape_);
  MoeLayerParams host =
      make_params(shape_, grads_.experts.w1.dim(0), grads_.experts.w1.dim(2), Device::kCpu);
  copy_params(grads_, host);
  std::memcpy(whole.wg.data(), host.wg.data(), static_cast<size_t>(host.wg.bytes()));
  const auto& g = host.experts;
  const int64_t e_loc = g.w1.dim(0), M = shape_.model_dim, hl = g.w1.dim(2);
  for (int64_t e = 0; e < e_loc; ++e) {
    ref::ExpertWeights<float> part;
    part.model_dim = M;
    part.hidden = hl;
    part.w1.assign(g.w1.data() + e * M * hl, g.w1.data() + (e + 1) * M * hl);
    part.b1.assign(g.b1.data() + e * hl, g.b1.data() + (e + 1) * hl);
    part.w2.assign(g.w2.data() + e * hl * M, g.w2.data() + (e + 1) * hl * M);
    ref::unslice_expert(shape_, part, first_expert_ + e, esp_rank_, esp_size_, whole);
    std::memcpy(whole.b2.data() + (first_expert_ + e) * M, g.b2.data() + e * M,
                static_cast<size_t>(M) * sizeof(float));
  }
}

void MoeLayer::zero_grad() {
  grads_.wg.zero();
  grads_.experts.w1.zero();
  grads_.experts.b1.zero();
  grads_.experts.w2.zero();
  grads_.experts.b2.zero();
}

const Tensor& MoeLayer::forward(const Tensor& x) {
  Tensor& in = bufs_[static_cast<size_t>(schedule_.input)];
  PARM_CHECK(x.numel() == in.numel(), "MoE layer input {} but the layer takes {}",
             shape_str(x.shape()), shape_str(in.shape()));
  in.copy_from(x);
  for (auto& p : fwd_phases_) p.clear();
  const bool timed = step_timed();
  if (timed) backend_->sync();
  for (size_t i = 0; i < schedule_.steps.size(); ++i) {
    const double t0 = timed ? now_us() : 0.0;
    run_step(schedule_.steps[i], false, 0.0f);
    if (!timed) continue;
    backend_->sync();  // a step's time includes the device work it queued
    fwd_us_[i] = now_us() - t0;
  }
  backend_->sync();
  return bufs_[static_cast<size_t>(schedule_.output)];
}

void MoeLayer::set_dl_z(float dl_z) {
  PARM_CHECK(dl_z == 0.0f || schedule_.z_loss,
             "MoE layer: a router z-loss gradient (dl_z {}) for a layer built without the "
             "z-loss (construct it with router_z_loss = true)", dl_z);
  dl_z_ = dl_z;
}

const Tensor& MoeLayer::backward(const Tensor& dout, float dl_aux, float dl_z) {
  set_dl_z(dl_z);
  for (size_t i = 0; i < dbufs_.size(); ++i)
    if (accumulated_[i]) dbufs_[i].zero();
  dwg_call_.zero();
  for (auto& p : bwd_phases_) p.clear();
  dbufs_[static_cast<size_t>(schedule_.output)].copy_from(dout);
  const bool timed = step_timed();
  if (timed) backend_->sync();
  for (size_t i = schedule_.steps.size(); i-- > 0;) {
    const double t0 = timed ? now_us() : 0.0;
    run_step(schedule_.steps[i], true, dl_aux);
    if (!timed) continue;
    backend_->sync();
    bwd_us_[i] = now_us() - t0;
  }
  backend_->add(grads_.wg.data(), dwg_call_.data(), grads_.wg.numel());
  backend_->sync();
  return dbufs_[static_cast<size_t>(schedule_.input)];
}

namespace {
// Runs pass() with the tensor in `slot` replaced by `target` (same shape and device), and
// puts the layer's own back afterwards, also when pass() throws.
template <class Pass>
void with_buffer(Tensor& slot, const Tensor& target, const char* what, Pass pass) {
  PARM_CHECK(target.shape() == slot.shape() && target.device() == slot.device(),
             "MoE layer {}: {} on {} given, the layer writes {} on {}", what,
             shape_str(target.shape()), device_name(target.device()), shape_str(slot.shape()),
             device_name(slot.device()));
  struct Restore {
    Tensor& slot;
    Tensor own;
    ~Restore() { slot = own; }
  } restore{slot, slot};
  slot = target;
  pass();
}
}  // namespace

void MoeLayer::forward_into(const Tensor& x, const Tensor& out) {
  // The input buffer is read again by the backward pass, so it must stay the layer's own.
  PARM_CHECK(schedule_.output != schedule_.input, "MoE layer: the schedule's output is its input");
  with_buffer(bufs_[static_cast<size_t>(schedule_.output)], out, "output",
              [&] { forward(x); });
}

void MoeLayer::backward_into(const Tensor& dout, float dl_aux, const Tensor& dx, float dl_z) {
  PARM_CHECK(schedule_.output != schedule_.input, "MoE layer: the schedule's output is its input");
  with_buffer(dbufs_[static_cast<size_t>(schedule_.input)], dx, "input gradient",
              [&] { backward(dout, dl_aux, dl_z); });
}

const int64_t* MoeLayer::packed_first(int id) {
  if (!schedule_.packed) return nullptr;
  const auto& spec = schedule_.buffers[static_cast<size_t>(id)];
  const auto& f = fills(id);
  auto& first = firsts_[static_cast<size_t>(id)];
  first.resize(f.size());  // E or blocks x E_loc: no allocation after the first pass
  const int64_t rows = packed_starts(f.data(), static_cast<int64_t>(f.size()), first.data());
  PARM_CHECK(rows <= spec.max_routed_rows,
             "buffer {}: its {} segments hold {} routed rows, more than the {} it is sized "
             "for (routing counts past the bound of docs/dropless.md)",
             spec.name, f.size(), rows, spec.max_routed_rows);
  return first.data();
}

Segments MoeLayer::segments(int id, bool grad, int64_t split) {
  const auto& spec = schedule_.buffers[static_cast<size_t>(id)];
  Tensor& t = grad ? dbufs_[static_cast<size_t>(id)] : bufs_[static_cast<size_t>(id)];
  const auto& f = fills(id);
  Segments seg{t.data(), spec.slots, f.data(), static_cast<int64_t>(f.size())};
  seg.first = packed_first(id);
  seg.back_to_back = seg.first != nullptr;  // packed: first[] is the prefix sum of the fills
  PARM_CHECK(seg.first != nullptr || seg.count * spec.slots * shape_.model_dim == t.numel(),
             "buffer {} ({}) has {} fill counts for segments of {} rows", spec.name,
             shape_str(t.shape()), f.size(), spec.slots);
  if (split == 1) return seg;
  view_fills_.resize(f.size() * static_cast<size_t>(split));
  view_first_.resize(view_fills_.size());
  for (size_t e = 0; e < f.size(); ++e)
    for (int64_t j = 0; j < split; ++j) {
      const schedule::RowPart part = schedule::dropless_part(f[e], j, split);
      const size_t v = e * static_cast<size_t>(split) + static_cast<size_t>(j);
      view_fills_[v] = static_cast<int32_t>(part.rows);
      view_first_[v] = (seg.first != nullptr ? seg.first[e] : static_cast<int64_t>(e) * spec.slots) + part.first;
    }
  Segments view{t.data(), spec.slots / split, view_fills_.data(), seg.count * split};
  view.first = view_first_.data();
  // Part j + 1 of a segment follows part j, and the next segment's part 0 its last part.
  view.back_to_back = seg.back_to_back;
  return view;
}

void MoeLayer::run_dropless_move(const Step& s, Move move, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const int64_t M = shape_.model_dim;
  const int n = c.size();
  BackendRowOps ops(*backend_);
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  // The fill counts travel ahead of the rows they size.
  if (!backward && s.carries_fills && (move == Move::kAllGather || move == Move::kAllToAll)) {
    post_fills(s.group, move == Move::kAllGather, fills(s.in), fills(s.out));
    meta_.wait();
  }
  switch (move) {
    case Move::kKeepChunk:
      if (!backward) slice_fills(s);
      RowExchange::keep(c, segments(from, backward, s.outer > 1 ? n : 1),
                        segments(to, backward), s.outer, M, ops);
      break;
    case Move::kAllGather:
      rows_.allgather(c, segments(from, backward), segments(to, backward, s.outer > 1 ? n : 1),
                      s.outer, M, ops);
      break;
    case Move::kAllToAll: rows_.alltoall(c, segments(from, backward), segments(to, backward), M, ops); break;
    case Move::kReduceScatter: {
      const Segments dst = segments(to, backward);
      rows_.reduce_scatter(c, segments(from, backward), dst,
                           row_scratch(s, (n - 1) * dst.routed_rows()), M, ops);
      break;
    }
    case Move::kAllReduce: {
      const Segments buf = segments(from, backward);
      rows_.allreduce(c, buf, row_scratch(s, n * buf.routed_rows()), M, ops);
      break;
    }
    case Move::kFusedDispatch:
    case Move::kFusedCombine: run_dropless_fused(s, move, backward, ops); break;
    default: PARM_CHECK(false, "step '{}' has no dropless form", s.label);
  }
}

void MoeLayer::run_dropless_fused(const Step& s, Move move, bool backward, RowOps& ops) {
  const int64_t M = shape_.model_dim;
  // The fused moves' two groups: (group, group2) forward, (group2, group) backward.
  Communicator& c1 = topo_.comm(backward ? s.group2 : s.group);
  Communicator& c2 = topo_.comm(backward ? s.group : s.group2);
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  if (move == Move::kFusedDispatch) {
    if (!backward && s.carries_fills) {  // the counts take the rows' two hops ahead of them
      post_fills(s.group, false, fills(s.in), fills_stage_);
      meta_.wait();
      post_fills(s.group2, true, fills_stage_, fills(s.out));
      meta_.wait();
    }
    int src = from;
    if (s.has_mp_part()) {  // the adjoint of the MP gather: keep my rows first
      // (Only a combine's adjoint has one: schedule/build.cpp gives no dispatch an MP part.)
      PARM_CHECK(backward, "step '{}': a fused dispatch with an MP part", s.label);
      Communicator& mp = topo_.comm(s.group3);
      RowExchange::keep(mp, segments(from, backward, mp.size()), segments(s.mid, backward),
                        s.outer, M, ops);
      src = s.mid;
    }
    fused_rows_.dispatch(c1, c2, segments(src, backward), segments(to, backward), M,
                         schedule_.chunks, ops);
    return;
  }
  // The combine; with an MP part it lands in mid and its last stage gathers into `to`. It
  // sums N_ESP copies of the routed rows of my ESP part of its source in the scratch.
  const Segments src = segments(from, backward);
  const int64_t part = src.count / c1.size();
  int64_t mine = 0;
  for (int64_t i = c1.rank() * part; i < (c1.rank() + 1) * part; ++i) mine += src.fill[i];
  float* scratch = row_scratch(s, c1.size() * mine);
  if (s.has_mp_part()) {
    if (!backward) fills(s.mid) = fills(schedule_.buffers[static_cast<size_t>(s.mid)].fills_like);
    Communicator& mp = topo_.comm(s.group3);
    const FusedRows::MpPart mp_part{&mp, segments(to, backward, mp.size())};
    fused_rows_.combine(c1, c2, src, segments(s.mid, backward), scratch, M, schedule_.chunks,
                        ops, &mp_part);
    return;
  }
  fused_rows_.combine(c1, c2, src, segments(to, backward), scratch, M, schedule_.chunks, ops);
}

float* MoeLayer::row_scratch(const Step& s, int64_t rows) {
  PARM_CHECK(rows * shape_.model_dim <= row_scratch_.numel(),
             "step '{}' sums {} received rows, more than the {} rows of the dropless "
             "reductions' scratch (routing counts past the bound of docs/dropless.md)",
             s.label, rows, row_scratch_.numel() / shape_.model_dim);
  return row_scratch_.data();
}

bool MoeLayer::dropless_move(const Step& s) const {
  return schedule_.dropless && segmented(s.in) && segmented(s.out) && schedule::is_collective(s.kind);
}

Tensor& MoeLayer::pass_tensor(int id, bool backward) {
  if (!backward) return bufs_[static_cast<size_t>(id)];
  return id == schedule::kGateWeight ? dwg_call_ : dbufs_[static_cast<size_t>(id)];
}

void MoeLayer::run_step(const Step& s, bool backward, float dl_aux) {
  if (!schedule::joins_sum(s, backward)) {
    run_pass(s, backward, dl_aux);
    return;
  }
  // Forward: the value summed (a kSumDup's move); backward: the gradient (a kShareDup's).
  Tensor& t = pass_tensor(s.joined_sum, backward);
  backend_->sync();  // the tensor is complete before the collective reads it
  RequestPtr sum = topo_.comm(s.group).iallreduce(t.data(), static_cast<size_t>(t.numel()),
                                                  DType::kF32);
  run_pass(s, backward, dl_aux);
  sum->wait();
}

void MoeLayer::run_pass(const Step& s, bool backward, float dl_aux) {
  const auto i = static_cast<size_t>(&s - schedule_.steps.data());
  const Move move = schedule::step_move(s.kind, backward);
  if (schedule_.dropless && !backward && s.out >= 0) {
    const int like = schedule_.buffers[static_cast<size_t>(s.out)].fills_like;
    if (like >= 0) fills(s.out) = fills(like);  // the combine path mirrors the dispatch path
  }
  if (dropless_move(s) && move != Move::kNone) {
    run_dropless_move(s, move, backward);
    return;
  }
  if (move == Move::kCompute) {
    // Phases only when timed: a device backend waits for the GPU at every phase it times.
    if (backward)
      compute_backward(s, dl_aux, step_timed() ? &bwd_phases_[i] : nullptr);
    else
      compute_forward(s, step_timed() ? &fwd_phases_[i] : nullptr);
    return;
  }
  if (move == Move::kNone) return;
  // The pass moves its source to its destination: forward in -> out, backward d out -> d in.
  Tensor& src = pass_tensor(backward ? s.out : s.in, backward);
  Tensor& dst = pass_tensor(backward ? s.in : s.out, backward);
  // The fill counts travel with the tokens of the forward pass (see fills_).
  const bool with_fills = !backward && s.carries_fills;
  Communicator& c = topo_.comm(s.group);
  // The fused moves' two groups: (group, group2) forward, (group2, group) backward.
  const Group g1 = backward ? s.group2 : s.group, g2 = backward ? s.group : s.group2;
  switch (move) {
    case Move::kNone:
    case Move::kCompute: break;  // handled above
    case Move::kKeepChunk:
      keep_chunk(c, s.outer, src, dst);
      if (!backward && !fills(s.in).empty()) slice_fills(s);
      break;
    case Move::kAllGather:
      if (with_fills) post_fills(s.group, true, fills(s.in), fills(s.out));
      gather_interleaved(c, src, s.outer, src.numel() / s.outer, dst);
      meta_.wait();
      break;
    case Move::kAllToAll:
      if (with_fills) post_fills(s.group, false, fills(s.in), fills(s.out));
      c.alltoall(src.data(), dst.data(), static_cast<size_t>(src.numel() / c.size()));
      meta_.wait();
      break;
    case Move::kReduceScatter:
      c.reduce_scatter(src.data(), dst.data(), static_cast<size_t>(dst.numel()));
      break;
    case Move::kAllReduce: c.allreduce(src.data(), static_cast<size_t>(src.numel())); break;
    case Move::kFusedDispatch: {
      const Tensor* from = &src;
      if (s.has_mp_part()) {  // the adjoint of the MP gather: keep my chunk first
        keep_chunk(topo_.comm(s.group3), s.outer, src, pass_tensor(s.mid, backward));
        from = &pass_tensor(s.mid, backward);
      }
      // The counts take the data's two hops: the EP exchange runs beside the pipeline, the
      // (intra-node, tiny) ESP gather of its result after it.
      if (with_fills) post_fills(g1, false, fills(s.in), fills_stage_);
      fused_dispatch_any(topo_.comm(g1), topo_.comm(g2), from->data(), dst.data(),
                         static_cast<size_t>(s.block), schedule_.chunks);
      meta_.wait();
      if (with_fills) {
        post_fills(g2, true, fills_stage_, fills(s.out));
        meta_.wait();
      }
      break;
    }
    case Move::kFusedCombine: {
      // With an MP part the combine lands in mid and its last stage gathers into dst.
      MpGatherPart mp{s.has_mp_part() ? &topo_.comm(s.group3) : nullptr, s.outer, s.chunk,
                      dst.data()};
      Tensor& to = s.has_mp_part() ? pass_tensor(s.mid, backward) : dst;
      fused_combine_any(topo_.comm(g1), topo_.comm(g2), src.data(), to.data(),
                        static_cast<size_t>(s.block), schedule_.chunks,
                        s.has_mp_part() ? &mp : nullptr);
      break;
    }
  }
}

void MoeLayer::compute_forward(const Step& s, moe::PhaseTimes* phases) {
  const auto& sc = schedule_;
  auto buf = [&](int id) -> Tensor& { return bufs_[static_cast<size_t>(id)]; };
  switch (s.kind) {
    case StepKind::kGate:
      backend_->set_router_bias(
          std::any_of(router_bias_->begin(), router_bias_->end(),
                      [](float b) { return b != 0.0f; })
              ? router_bias_->data()
              : nullptr);
      backend_->gate_forward(buf(s.in), params_.wg, shape_.topk, sc.capacity,
                             sc.dispatch_slots, buf(s.out).data(), phases);
      break;
    case StepKind::kAuxLoss:
      l_aux_ = backend_->aux_loss(buf(s.in).data(), shape_.experts, sc.total_tokens);
      l_z_ = sc.z_loss ? backend_->z_loss(buf(s.in).data(), shape_.experts, sc.total_tokens)
                       : 0.0f;
      break;
    case StepKind::kDispatch: {
      backend_->dispatch_forward(buf(s.in), buf(s.out));
      const auto& fill = backend_->fill();
      fills(s.out).assign(fill.begin(), fill.end());
      break;
    }
    case StepKind::kExperts: {
      const int64_t segments = sc.expert_blocks * params_.experts.w1.dim(0);
      PARM_CHECK(static_cast<int64_t>(fills(s.in).size()) == segments,
                 "experts' input has {} fill counts, expected {}", fills(s.in).size(), segments);
      backend_->experts_forward(buf(s.in), params_.experts, sc.expert_blocks,
                                sc.exchange_slots, fills(s.in).data(), packed_first(s.in),
                                sc.adds_b2, buf(s.out), phases);
      break;
    }
    case StepKind::kCombine: backend_->combine_forward(buf(s.in), buf(s.out)); break;
    default: PARM_CHECK(false, "step '{}' is not a computation", s.label);
  }
}

void MoeLayer::compute_backward(const Step& s, float dl_aux, moe::PhaseTimes* phases) {
  const auto& sc = schedule_;
  auto buf = [&](int id) -> Tensor& { return bufs_[static_cast<size_t>(id)]; };
  auto dbuf = [&](int id) -> Tensor& { return dbufs_[static_cast<size_t>(id)]; };
  switch (s.kind) {
    case StepKind::kGate:
      backend_->gate_backward(buf(s.in), params_.wg, dbuf(s.out).data(), dwg_call_, dbuf(s.in),
                              phases);
      break;
    case StepKind::kAuxLoss:
      backend_->aux_loss_backward(buf(s.in).data(), shape_.experts, sc.total_tokens, dl_aux,
                                  dl_z_, dbuf(s.in).data());
      break;
    case StepKind::kDispatch: backend_->dispatch_backward(dbuf(s.out), dbuf(s.in)); break;
    case StepKind::kExperts:
      // dout and din have the input's counts, so its segment starts.
      backend_->experts_backward(dbuf(s.out), params_.experts, sc.expert_blocks,
                                 sc.exchange_slots, fills(s.in).data(), packed_first(s.in),
                                 grads_.experts, dbuf(s.in), phases);
      break;
    case StepKind::kCombine:
      backend_->combine_backward(buf(s.in), dbuf(s.out), dbuf(s.in));
      break;
    default: PARM_CHECK(false, "step '{}' is not a computation", s.label);
  }
}

}  // namespace parm
