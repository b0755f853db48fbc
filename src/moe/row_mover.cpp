#include "moe/row_mover.h"

#include <algorithm>

#include "parm/error.h"

namespace parm {

using schedule::Move;
using schedule::Step;

namespace {

// The local copies and sums of the row exchanges, on the layer's backend.
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

}  // namespace

RowMover::RowMover(Topology& topo, const schedule::Schedule& sc, moe::LayerBackend& backend,
                   StepBuffers& bufs, const std::vector<const Step*>& steps)
    : topo_(topo), sc_(sc), bufs_(bufs), ops_(std::make_unique<BackendRowOps>(backend)) {
  // The reductions receive every peer's routed rows of a buffer in the experts' layout
  // (blocks of E_loc segments): at most its max_routed_rows (docs/dropless.md, "Worst case
  // per buffer"). A reduce-scatter receives n - 1 peers' rows of its destination, an
  // all-reduce n of its buffer, a fused combine N_ESP of its source's part (its source over
  // N_ESP). The row exchanges' packing buffers are sized here too, as their first call would.
  PARM_CHECK(sc.packed, "row moves for a schedule with padded capacity buffers (its "
                        "buffers are not packed)");
  const int64_t M = bufs.model_dim();
  const auto routed_elems = [&](int id) {  // at most, of buffer id
    return sc.buffers[static_cast<size_t>(id)].max_routed_rows * M;
  };
  const auto segments_of = [&](int id) {
    const auto& b = sc.buffers[static_cast<size_t>(id)];
    return shape_numel(b.shape) / (b.slots * M);
  };
  int64_t elems = 0;
  for (const Step* s : steps)
    for (bool backward : {false, true}) {
      const Move m = schedule::step_move(s->kind, backward);
      const int from = backward ? s->out : s->in, to = backward ? s->in : s->out;
      Communicator& c = topo.comm(s->group);
      const int64_t n = c.size();
      if (m == Move::kReduceScatter) elems = std::max(elems, routed_elems(to) * (n - 1));
      if (m == Move::kAllReduce) elems = std::max(elems, routed_elems(to) * n);
      if (m == Move::kFusedCombine) elems = std::max(elems, routed_elems(from));
      const CommOp op = m == Move::kAllToAll        ? CommOp::kAllToAllv
                        : m == Move::kAllGather     ? CommOp::kAllGather
                        : m == Move::kReduceScatter ? CommOp::kReduceScatter
                        : m == Move::kAllReduce     ? CommOp::kAllReduce
                                                    : CommOp::kMetadata;
      if (op != CommOp::kMetadata)
        rows_.reserve_packing(
            c, RowExchange::ranges_per_peer(op, segments_of(from), segments_of(to), c.size()));
    }
  if (elems > 0) scratch_ = Tensor({elems}, topo.device());
}

Segments RowMover::segments(int id, bool grad, int64_t split) {
  const auto& spec = sc_.buffers[static_cast<size_t>(id)];
  Tensor& t = grad ? bufs_.grad(id) : bufs_.value(id);
  const auto& f = bufs_.fills(id);
  Segments seg{t.data(), spec.slots, f.data(), static_cast<int64_t>(f.size())};
  seg.first = bufs_.starts(id);
  seg.back_to_back = true;  // packed: first[] is the prefix sum of the fills
  if (split == 1) return seg;
  view_fills_.resize(f.size() * static_cast<size_t>(split));
  view_first_.resize(view_fills_.size());
  for (size_t e = 0; e < f.size(); ++e)
    for (int64_t j = 0; j < split; ++j) {
      const schedule::RowPart part = schedule::dropless_part(f[e], j, split);
      const size_t v = e * static_cast<size_t>(split) + static_cast<size_t>(j);
      view_fills_[v] = static_cast<int32_t>(part.rows);
      view_first_[v] = seg.first[e] + part.first;
    }
  Segments view{t.data(), spec.slots / split, view_fills_.data(), seg.count * split};
  view.first = view_first_.data();
  // Part j + 1 of a segment follows part j, and the next segment's part 0 its last part.
  view.back_to_back = seg.back_to_back;
  return view;
}

float* RowMover::scratch(const Step& s, int64_t rows) {
  const int64_t M = bufs_.model_dim();
  PARM_CHECK(rows * M <= scratch_.numel(),
             "step '{}' sums {} received rows, more than the {} rows of the dropless "
             "reductions' scratch (routing counts past the bound of docs/dropless.md)",
             s.label, rows, scratch_.numel() / M);
  return scratch_.data();
}

void RowMover::slice_fills(const Step& s) {
  const auto& in = bufs_.fills(s.in);
  auto& out = bufs_.fills(s.out);
  Communicator& c = topo_.comm(s.group);
  out.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = static_cast<int32_t>(schedule::dropless_part(in[i], c.rank(), c.size()).rows);
}

void RowMover::keep_chunk(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  if (!backward) slice_fills(s);
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  RowExchange::keep(c, segments(from, backward, s.outer > 1 ? c.size() : 1),
                    segments(to, backward), s.outer, bufs_.model_dim(), *ops_);
}

void RowMover::allgather(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  bufs_.post_step_fills(s, backward, true);
  bufs_.wait_fills();
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  rows_.allgather(c, segments(from, backward), segments(to, backward, s.outer > 1 ? c.size() : 1),
                  s.outer, bufs_.model_dim(), *ops_);
}

void RowMover::alltoall(const Step& s, bool backward) {
  bufs_.post_step_fills(s, backward, false);
  bufs_.wait_fills();
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  rows_.alltoall(topo_.comm(s.group), segments(from, backward), segments(to, backward),
                 bufs_.model_dim(), *ops_);
}

void RowMover::reduce_scatter(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  const Segments dst = segments(to, backward);
  rows_.reduce_scatter(c, segments(from, backward), dst,
                       scratch(s, (c.size() - 1) * dst.routed_rows()), bufs_.model_dim(), *ops_);
}

void RowMover::allreduce(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const Segments buf = segments(backward ? s.out : s.in, backward);  // in place
  rows_.allreduce(c, buf, scratch(s, c.size() * buf.routed_rows()), bufs_.model_dim(), *ops_);
}

// The fused moves' two groups: (group, group2) forward, (group2, group) backward.

void RowMover::fused_dispatch(const Step& s, bool backward) {
  Communicator& c1 = topo_.comm(backward ? s.group2 : s.group);
  Communicator& c2 = topo_.comm(backward ? s.group : s.group2);
  const int64_t M = bufs_.model_dim();
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  if (!backward && s.carries_fills) {  // the counts take the rows' two hops ahead of them
    bufs_.post_fills(s.group, false, bufs_.fills(s.in), bufs_.fills_stage());
    bufs_.wait_fills();
    bufs_.post_fills(s.group2, true, bufs_.fills_stage(), bufs_.fills(s.out));
    bufs_.wait_fills();
  }
  int src = from;
  if (s.has_mp_part()) {  // the adjoint of the MP gather: keep my rows first
    // (Only a combine's adjoint has one: schedule/build.cpp gives no dispatch an MP part.)
    PARM_CHECK(backward, "step '{}': a fused dispatch with an MP part", s.label);
    Communicator& mp = topo_.comm(s.group3);
    RowExchange::keep(mp, segments(from, backward, mp.size()), segments(s.mid, backward),
                      s.outer, M, *ops_);
    src = s.mid;
  }
  fused_rows_.dispatch(c1, c2, segments(src, backward), segments(to, backward), M, sc_.chunks,
                       *ops_);
}

void RowMover::fused_combine(const Step& s, bool backward) {
  Communicator& c1 = topo_.comm(backward ? s.group2 : s.group);
  Communicator& c2 = topo_.comm(backward ? s.group : s.group2);
  const int64_t M = bufs_.model_dim();
  const int from = backward ? s.out : s.in, to = backward ? s.in : s.out;
  // With an MP part it lands in mid and its last stage gathers into `to`. It sums N_ESP
  // copies of the routed rows of my ESP part of its source in the scratch.
  const Segments src = segments(from, backward);
  const int64_t part = src.count / c1.size();
  int64_t mine = 0;
  for (int64_t i = c1.rank() * part; i < (c1.rank() + 1) * part; ++i) mine += src.fill[i];
  float* rows = scratch(s, c1.size() * mine);
  if (s.has_mp_part()) {
    Communicator& mp = topo_.comm(s.group3);
    const FusedRows::MpPart mp_part{&mp, segments(to, backward, mp.size())};
    fused_rows_.combine(c1, c2, src, segments(s.mid, backward), rows, M, sc_.chunks, *ops_,
                        &mp_part);
    return;
  }
  fused_rows_.combine(c1, c2, src, segments(to, backward), rows, M, sc_.chunks, *ops_);
}

}  // namespace parm
