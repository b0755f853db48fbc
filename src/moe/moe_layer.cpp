// The executor: runs a schedule's step list forward, and its adjoint in reverse order.
#include "moe/moe_layer.h"

#include <algorithm>
#include <cstring>

#include "comm/fused.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

using schedule::Step;
using schedule::StepKind;

namespace {

// (outer, n, chunk) -> my (outer, chunk): "keep my slice" (MP off).
void take_chunk(const Tensor& full, int64_t outer, int n, int j, int64_t chunk, Tensor& mine) {
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(mine.data() + o * chunk, full.data() + (o * n + j) * chunk,
                static_cast<size_t>(chunk) * sizeof(float));
}

// AllGather of (outer, chunk) parts into (outer, n, chunk) on every rank.
void gather_interleaved(Communicator& c, const Tensor& mine, int64_t outer, int64_t chunk,
                        Tensor& scratch, Tensor& full) {
  const int n = c.size();
  if (outer == 1) {
    c.allgather(mine.data(), full.data(), static_cast<size_t>(chunk));
    return;
  }
  if (scratch.numel() < full.numel()) scratch = Tensor({full.numel()});
  c.allgather(mine.data(), scratch.data(), static_cast<size_t>(outer * chunk));  // (n, outer, chunk)
  for (int p = 0; p < n; ++p)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(full.data() + (o * n + p) * chunk, scratch.data() + (p * outer + o) * chunk,
                  static_cast<size_t>(chunk) * sizeof(float));
}

}  // namespace

MoeLayer::MoeLayer(Topology& topo, const ref::MoeShape& shape, schedule::Kind kind, bool fuse,
                   int chunks)
    : topo_(topo), shape_(shape) {
  const Layout& l = topo.layout();
  esp_rank_ = topo.comm(Group::kEsp).rank();
  esp_size_ = l.esp;
  schedule_ = schedule::build({shape, l, esp_rank_, fuse, chunks}, kind);
  const int64_t M = shape.model_dim, E = shape.experts;
  const int64_t e_loc = E / l.ep, hl = shape.hidden / l.esp;
  first_expert_ = static_cast<int>(topo.comm(Group::kEp).rank() * e_loc);
  for (MoeLayerParams* p : {&params_, &grads_}) {
    p->wg = Tensor({M, E});
    p->experts.w1 = Tensor({e_loc, M, hl});
    p->experts.b1 = Tensor({e_loc, hl});
    p->experts.w2 = Tensor({e_loc, hl, M});
    p->experts.b2 = Tensor({e_loc, M});
  }
  dwg_call_ = Tensor({M, E});
  for (const auto& b : schedule_.buffers) {
    bufs_.emplace_back(b.shape);
    dbufs_.emplace_back(b.shape);
  }
  probs_ = Tensor({schedule_.gate_tokens, E});
  dprobs_ = Tensor({schedule_.gate_tokens, E});
  const size_t num_steps = schedule_.steps.size();
  fwd_us_.assign(num_steps, 0.0);
  bwd_us_.assign(num_steps, 0.0);
  fwd_phases_.assign(num_steps, {});
  bwd_phases_.assign(num_steps, {});
  accumulated_ = schedule::accumulated_gradients(schedule_);
  fills_.assign(schedule_.buffers.size(), {});
  ws_.reserve(e_loc, schedule_.expert_blocks * schedule_.exchange_slots, M, hl);
}

int64_t MoeLayer::held_bytes() const {
  int64_t b = 0;
  for (const MoeLayerParams* p : {&params_, &grads_})
    b += p->wg.bytes() + p->experts.w1.bytes() + p->experts.b1.bytes() +
         p->experts.w2.bytes() + p->experts.b2.bytes();
  for (const auto* list : {&bufs_, &dbufs_, &ws_.in, &ws_.pre, &ws_.act})
    for (const Tensor& t : *list) b += t.bytes();
  b += dwg_call_.bytes() + probs_.bytes() + dprobs_.bytes() + gather_scratch_.bytes() +
       ws_.out_rows.bytes() + ws_.d_out.bytes() + ws_.d_act.bytes();
  return b;
}

void MoeLayer::slice_fills(const Step& s) {
  // S2's "keep my slots": MP rank j keeps slots [j*cs, (j+1)*cs) of every expert, so its
  // fill is the part of the expert's filled prefix that falls there.
  const auto& in = fills(s.in);
  auto& out = fills(s.out);
  const int64_t cs = s.chunk / shape_.model_dim;
  const int64_t lo = topo_.comm(s.group).rank() * cs;
  out.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = static_cast<int32_t>(std::clamp<int64_t>(in[i] - lo, 0, cs));
}

void MoeLayer::post_fills(Communicator& c, bool gather, const std::vector<int32_t>& in,
                          std::vector<int32_t>& out) {
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

void MoeLayer::load_whole(const ref::MoeParams<float>& whole) {
  whole.check(shape_);
  std::memcpy(params_.wg.data(), whole.wg.data(), static_cast<size_t>(params_.wg.bytes()));
  auto& x = params_.experts;
  const int64_t e_loc = x.w1.dim(0), M = shape_.model_dim, hl = x.w1.dim(2);
  for (int64_t e = 0; e < e_loc; ++e) {
    const auto part = ref::slice_expert(shape_, whole, first_expert_ + e, esp_rank_, esp_size_);
    std::memcpy(x.w1.data() + e * M * hl, part.w1.data(), part.w1.size() * sizeof(float));
    std::memcpy(x.b1.data() + e * hl, part.b1.data(), part.b1.size() * sizeof(float));
    std::memcpy(x.w2.data() + e * hl * M, part.w2.data(), part.w2.size() * sizeof(float));
    std::memcpy(x.b2.data() + e * M, whole.b2.data() + (first_expert_ + e) * M,
                static_cast<size_t>(M) * sizeof(float));
  }
}

void MoeLayer::store_whole_grads(ref::MoeParams<float>& whole) const {
  whole.check(shape_);
  std::memcpy(whole.wg.data(), grads_.wg.data(), static_cast<size_t>(grads_.wg.bytes()));
  const auto& g = grads_.experts;
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
  for (size_t i = 0; i < schedule_.steps.size(); ++i) {
    const double t0 = now_us();
    run_forward_step(schedule_.steps[i]);
    fwd_us_[i] = now_us() - t0;
  }
  return bufs_[static_cast<size_t>(schedule_.output)];
}

const Tensor& MoeLayer::backward(const Tensor& dout, float dl_aux) {
  for (size_t i = 0; i < dbufs_.size(); ++i)
    if (accumulated_[i]) dbufs_[i].zero();
  dwg_call_.zero();
  for (auto& p : bwd_phases_) p.clear();
  dbufs_[static_cast<size_t>(schedule_.output)].copy_from(dout);
  for (size_t i = schedule_.steps.size(); i-- > 0;) {
    const double t0 = now_us();
    run_backward_step(schedule_.steps[i], dl_aux);
    bwd_us_[i] = now_us() - t0;
  }
  float* g = grads_.wg.data();
  for (int64_t i = 0; i < grads_.wg.numel(); ++i) g[i] += dwg_call_[i];
  return dbufs_[static_cast<size_t>(schedule_.input)];
}

void MoeLayer::run_forward_step(const Step& s) {
  const auto& sc = schedule_;
  moe::PhaseTimes* phases = &fwd_phases_[static_cast<size_t>(&s - sc.steps.data())];
  auto buf = [&](int id) -> Tensor& { return bufs_[static_cast<size_t>(id)]; };
  switch (s.kind) {
    case StepKind::kGate:
      moe::gate_forward(buf(s.in), params_.wg, shape_.topk, sc.capacity, sc.dispatch_slots,
                        probs_, routing_, buf(s.out).data(), phases);
      break;
    case StepKind::kAuxLoss:
      l_aux_ = moe::aux_loss(buf(s.in).data(), shape_.experts, sc.total_tokens);
      break;
    case StepKind::kDispatch: {
      moe::dispatch_forward(buf(s.in), routing_, buf(s.out));
      fills(s.out).assign(routing_.fill.begin(), routing_.fill.end());
      break;
    }
    case StepKind::kExperts: {
      const int64_t segments = sc.expert_blocks * params_.experts.w1.dim(0);
      PARM_CHECK(static_cast<int64_t>(fills(s.in).size()) == segments,
                 "experts' input has {} fill counts, expected {}", fills(s.in).size(), segments);
      moe::experts_forward(buf(s.in), params_.experts, sc.expert_blocks, sc.exchange_slots,
                           fills(s.in).data(), sc.adds_b2, ws_, buf(s.out), phases);
      break;
    }
    case StepKind::kCombine: moe::combine_forward(buf(s.in), routing_, buf(s.out)); break;
    case StepKind::kSlice: {
      Communicator& c = topo_.comm(s.group);
      take_chunk(buf(s.in), s.outer, c.size(), c.rank(), s.chunk, buf(s.out));
      if (!fills(s.in).empty()) slice_fills(s);
      break;
    }
    case StepKind::kGatherDup:
      gather_interleaved(topo_.comm(s.group), buf(s.in), s.outer, s.chunk, gather_scratch_,
                         buf(s.out));
      break;
    case StepKind::kAllToAll: {  // on the dispatch path, the fill counts travel alongside
      Communicator& c = topo_.comm(s.group);
      if (s.carries_fills) post_fills(c, false, fills(s.in), fills(s.out));
      c.alltoall(buf(s.in).data(), buf(s.out).data(),
                 static_cast<size_t>(buf(s.in).numel() / c.size()));
      meta_.wait();
      break;
    }
    case StepKind::kGatherShard: {
      Communicator& c = topo_.comm(s.group);
      if (s.carries_fills) post_fills(c, true, fills(s.in), fills(s.out));
      c.allgather(buf(s.in).data(), buf(s.out).data(), static_cast<size_t>(buf(s.in).numel()));
      meta_.wait();
      break;
    }
    case StepKind::kReduceScatter:
      topo_.comm(s.group).reduce_scatter(buf(s.in).data(), buf(s.out).data(),
                                         static_cast<size_t>(buf(s.out).numel()));
      break;
    case StepKind::kSumDup:
      topo_.comm(s.group).allreduce(buf(s.in).data(), static_cast<size_t>(buf(s.in).numel()));
      break;
    case StepKind::kShareDup: break;
    case StepKind::kFusedDispatch: {
      // The counts take the data's two hops: the EP exchange runs beside the pipeline, the
      // (intra-node, tiny) ESP gather of its result after it.
      Communicator& ep = topo_.comm(s.group);
      Communicator& esp = topo_.comm(s.group2);
      post_fills(ep, false, fills(s.in), fills_stage_);
      fused_dispatch(ep, esp, buf(s.in).data(), buf(s.out).data(), static_cast<size_t>(s.block),
                     schedule_.chunks);
      meta_.wait();
      post_fills(esp, true, fills_stage_, fills(s.out));
      meta_.wait();
      break;
    }
    case StepKind::kFusedCombine: {
      MpGatherPart mp{s.has_mp_part() ? &topo_.comm(s.group3) : nullptr, s.outer, s.chunk,
                      buf(s.out).data()};
      fused_combine(topo_.comm(s.group), topo_.comm(s.group2), buf(s.in).data(),
                    buf(s.has_mp_part() ? s.mid : s.out).data(), static_cast<size_t>(s.block),
                    schedule_.chunks, s.has_mp_part() ? &mp : nullptr);
      break;
    }
  }
}

void MoeLayer::run_backward_step(const Step& s, float dl_aux) {
  const auto& sc = schedule_;
  moe::PhaseTimes* phases = &bwd_phases_[static_cast<size_t>(&s - sc.steps.data())];
  auto buf = [&](int id) -> Tensor& { return bufs_[static_cast<size_t>(id)]; };
  auto dbuf = [&](int id) -> Tensor& { return dbufs_[static_cast<size_t>(id)]; };
  switch (s.kind) {
    case StepKind::kGate:
      moe::gate_backward(buf(s.in), params_.wg, probs_, routing_, dweight_, dbuf(s.out).data(),
                         dprobs_, dwg_call_, dbuf(s.in), phases);
      break;
    case StepKind::kAuxLoss:
      moe::aux_loss_backward(buf(s.in).data(), shape_.experts, sc.total_tokens, dl_aux,
                             dbuf(s.in).data());
      break;
    case StepKind::kDispatch: moe::dispatch_backward(dbuf(s.out), routing_, dbuf(s.in)); break;
    case StepKind::kExperts:
      moe::experts_backward(dbuf(s.out), params_.experts, sc.expert_blocks, sc.exchange_slots,
                            fills(s.in).data(), ws_, grads_.experts, dbuf(s.in), phases);
      break;
    case StepKind::kCombine:
      moe::combine_backward(buf(s.in), dbuf(s.out), routing_, dbuf(s.in), dweight_);
      break;
    case StepKind::kSlice:  // adjoint of "keep my slice": AllGather
      gather_interleaved(topo_.comm(s.group), dbuf(s.out), s.outer, s.chunk, gather_scratch_,
                         dbuf(s.in));
      break;
    case StepKind::kGatherDup: {  // adjoint of the MP-restoring AllGather: keep my slice
      Communicator& c = topo_.comm(s.group);
      take_chunk(dbuf(s.out), s.outer, c.size(), c.rank(), s.chunk, dbuf(s.in));
      break;
    }
    case StepKind::kAllToAll: {
      Communicator& c = topo_.comm(s.group);
      c.alltoall(dbuf(s.out).data(), dbuf(s.in).data(),
                 static_cast<size_t>(dbuf(s.out).numel() / c.size()));
      break;
    }
    case StepKind::kGatherShard:
      topo_.comm(s.group).reduce_scatter(dbuf(s.out).data(), dbuf(s.in).data(),
                                         static_cast<size_t>(dbuf(s.in).numel()));
      break;
    case StepKind::kReduceScatter:
      topo_.comm(s.group).allgather(dbuf(s.out).data(), dbuf(s.in).data(),
                                    static_cast<size_t>(dbuf(s.out).numel()));
      break;
    case StepKind::kSumDup: break;  // the gradient of a duplicated sum is already complete
    case StepKind::kShareDup: {
      Tensor& d = s.in == schedule::kGateWeight ? dwg_call_ : dbuf(s.in);
      topo_.comm(s.group).allreduce(d.data(), static_cast<size_t>(d.numel()));
      break;
    }
    case StepKind::kFusedDispatch:  // adjoint: the combine collective
      fused_combine(topo_.comm(s.group2), topo_.comm(s.group), dbuf(s.out).data(),
                    dbuf(s.in).data(), static_cast<size_t>(s.block), schedule_.chunks);
      break;
    case StepKind::kFusedCombine: {  // adjoint: [keep my chunk,] the dispatch collective
      int from = s.out;
      if (s.has_mp_part()) {
        Communicator& mp = topo_.comm(s.group3);
        take_chunk(dbuf(s.out), s.outer, mp.size(), mp.rank(), s.chunk, dbuf(s.mid));
        from = s.mid;
      }
      fused_dispatch(topo_.comm(s.group2), topo_.comm(s.group), dbuf(from).data(),
                     dbuf(s.in).data(), static_cast<size_t>(s.block), schedule_.chunks);
      break;
    }
  }
}

}  // namespace parm
