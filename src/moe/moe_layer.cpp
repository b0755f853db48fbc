// The executor: runs a schedule's step list forward, and its adjoint in reverse order.
#include "moe/moe_layer.h"

#include <algorithm>
#include <cstring>

#include "parm/error.h"
#include "parm/memory.h"
#include "parm/timer.h"

namespace parm {

using schedule::Move;
using schedule::Step;
using schedule::StepKind;

namespace {

moe::ExpertShards make_ffns(const MoeShape& shape, int64_t n, int64_t hl, Device d) {
  const int64_t M = shape.model_dim;
  const bool biases = has_expert_biases(shape.expert_mlp), gated = is_gated(shape.expert_mlp);
  moe::ExpertShards w;
  w.w1 = Tensor({n, M, hl}, d);
  w.b1 = Tensor({n, biases ? hl : 0}, d);
  w.w2 = Tensor({n, hl, M}, d);
  w.b2 = Tensor({n, biases ? M : 0}, d);
  w.w3 = Tensor({n, gated ? M : 0, hl}, d);
  return w;
}

MoeLayerParams make_params(const MoeShape& shape, int64_t e_loc, int64_t hl, int mp, Device d) {
  const int64_t M = shape.model_dim, E = shape.experts;
  MoeLayerParams p;
  p.wg = Tensor({M, E}, d);
  p.experts = make_ffns(shape, e_loc, hl, d);
  p.shared = make_ffns(shape, shape.shared_experts, shape.shared_hidden / mp, d);
  p.shared_gate = Tensor({shape.shared_gate ? M : 0}, d);
  return p;
}

// FFN i of a set of shards (routed or shared) as the oracle's ExpertWeights, and back; b2 is
// not part of it (whole on every rank of the shard's group).
ref::ExpertWeights<float> ffn_part(const moe::ExpertShards& w, int64_t i, ExpertMlp mlp) {
  const int64_t M = w.w1.dim(1), hl = w.w1.dim(2);
  auto rows = [](const Tensor& t, int64_t i, int64_t n) {
    return std::vector<float>(t.data() + i * n, t.data() + (i + 1) * n);
  };
  ref::ExpertWeights<float> part;
  part.mlp = mlp;
  part.model_dim = M;
  part.hidden = hl;
  part.w1 = rows(w.w1, i, M * hl);
  part.w2 = rows(w.w2, i, hl * M);
  if (w.gated()) part.w3 = rows(w.w3, i, M * hl);
  if (has_expert_biases(mlp)) part.b1 = rows(w.b1, i, hl);
  return part;
}

void place_ffn_part(const ref::ExpertWeights<float>& part, int64_t i, moe::ExpertShards& w) {
  auto put = [](const std::vector<float>& v, Tensor& t, int64_t i) {
    std::copy(v.begin(), v.end(), t.data() + i * static_cast<int64_t>(v.size()));
  };
  put(part.w1, w.w1, i);
  put(part.w2, w.w2, i);
  if (w.gated()) put(part.w3, w.w3, i);
  if (!part.b1.empty()) put(part.b1, w.b1, i);
}

schedule::Schedule layer_schedule(Topology& topo, const MoeShape& shape, schedule::Kind kind,
                                  bool fuse, int chunks, bool router_z_loss,
                                  AuxScope aux_scope) {
  PARM_CONFIG_CHECK(!router_z_loss || topo.device() == Device::kCpu,
                    "the router z-loss runs on the CPU only, this MoE layer is on {}; use "
                    "router_z_loss 0 there", device_name(topo.device()));
  return schedule::build({shape, topo.layout(), topo.comm(Group::kEsp).rank(), fuse, chunks,
                          router_z_loss, aux_scope},
                         kind);
}

}  // namespace

void copy_params(const MoeLayerParams& from, MoeLayerParams& to) {
  to.wg.copy_from(from.wg);
  to.shared_gate.copy_from(from.shared_gate);
  for (auto [f, t] : {std::pair{&from.experts, &to.experts}, {&from.shared, &to.shared}}) {
    const auto src = f->all();
    const auto dst = t->all();
    for (size_t i = 0; i < src.size(); ++i) dst[i]->copy_from(*src[i]);
  }
}

MoeLayerParams params_on(const MoeLayerParams& p, Device device) {
  auto on = [device](const moe::ExpertShards& w) {
    return moe::ExpertShards{w.w1.to(device), w.b1.to(device), w.w2.to(device),
                             w.b2.to(device), w.w3.to(device)};
  };
  return {p.wg.to(device), on(p.experts), on(p.shared), p.shared_gate.to(device)};
}

MoeLayer::MoeLayer(Topology& topo, const MoeShape& shape, schedule::Kind kind, bool fuse,
                   int chunks, Precision precision, bool router_z_loss, AuxScope aux_scope,
                   const MoeLayer* share_params, moe::ActivationPool* acts_pool,
                   bool pool_buffers)
    : topo_(topo),
      shape_(shape),
      schedule_(layer_schedule(topo, shape, kind, fuse, chunks, router_z_loss, aux_scope)),
      pooled_(pool_buffers && acts_pool != nullptr ? recomputable_buffers(schedule_)
                                                   : std::vector<bool>{}),
      bufs_(topo, schedule_, shape, pooled_.empty() ? nullptr : acts_pool, pooled_),
      router_bias_(
          std::make_shared<std::vector<float>>(static_cast<size_t>(shape.experts), 0.0f)) {
  const Layout& l = topo.layout();
  const Device device = topo.device();
  esp_rank_ = topo.comm(Group::kEsp).rank();
  esp_size_ = l.esp;
  mp_rank_ = topo.comm(Group::kMp).rank();
  mp_size_ = l.mp;
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
  // Dropless or unpadded: buffers packed (sized by the rows routed; docs/dropless.md).
  sizes.dropless = sizes.packed = schedule_.packed;
  sizes.expert_mlp = shape.expert_mlp;
  sizes.shared_experts = shape.shared_experts;
  sizes.shared_rows = schedule_.shared_rows;
  sizes.shared_hidden_shard = shape.has_shared() ? shape.shared_hidden / l.mp : 0;
  sizes.shared_gate = shape.shared_gate;
  sizes.acts_pool = acts_pool;
  sizes.z_loss = schedule_.z_loss;
  // moe-act: the experts step recomputes its rows; moe: the replay of the forward does.
  recompute_experts_ = acts_pool != nullptr && pooled_.empty();
  PARM_CONFIG_CHECK(pooled_.empty() || device == Device::kCpu,
                    "--recompute moe (train.recompute) runs on the CPU layer; use --recompute "
                    "moe-act or block there");
  if (!pooled_.empty()) replay_stats_ = Tensor({schedule::stats_numel(E, true)}, device);
  if (schedule_.packed)
    sizes.max_local_rows = schedule::dropless_local_rows(schedule_, shape.topk, e_loc);
  backend_ = moe::make_backend(device, precision, sizes);
  backend_->set_router(shape.router);
  // The gate's rows among the sequences of the sequence-wise l_aux: S1 gates MP rank j's
  // slice, rows [j T / N_MP, (j + 1) T / N_MP) of the MP group's T.
  if (shape.aux_seq_len > 0) {
    const bool sliced = schedule_.gate_tokens != shape.tokens;
    backend_->set_aux_rows({sliced ? mp_rank_ * schedule_.gate_tokens : 0, shape.aux_seq_len},
                           shape.aux_sequences());
  }
  if (share_params != nullptr) {
    PARM_CHECK(share_params->shape_.str() == shape.str() &&
                   share_params->device() == device,
               "MoE layer sharing the parameters of a layer of shape {} on {}, it is {} on {}",
               share_params->shape_.str(), device_name(share_params->device()), shape.str(),
               device_name(device));
    params_ = share_params->params_;
    grads_ = share_params->grads_;
    router_bias_ = share_params->router_bias_;
  } else {
    {
      MemoryKindScope kind(MemoryKind::kParameters);
      params_ = make_params(shape, e_loc, hl, l.mp, device);
    }
    MemoryKindScope kind(MemoryKind::kGradients);
    grads_ = make_params(shape, e_loc, hl, l.mp, device);
  }
  const size_t num_steps = schedule_.steps.size();
  fwd_us_.assign(num_steps, 0.0);
  bwd_us_.assign(num_steps, 0.0);
  fwd_phases_.assign(num_steps, {});
  bwd_phases_.assign(num_steps, {});
  accumulated_ = schedule::accumulated_gradients(schedule_);
  // Each collective to its mover, which sizes its scratch for the steps it runs.
  std::vector<const Step*> dense_steps, row_steps;
  for (const Step& s : schedule_.steps)
    if (schedule::is_collective(s.kind))
      (schedule::moves_routed_rows(schedule_, s) ? row_steps : dense_steps).push_back(&s);
  dense_ = std::make_unique<DenseMover>(topo, schedule_, *backend_, bufs_, dense_steps);
  if (!row_steps.empty())
    rows_ = std::make_unique<RowMover>(topo, schedule_, *backend_, bufs_, row_steps);
  movers_.assign(num_steps, nullptr);
  const auto index = [&](const Step* s) { return static_cast<size_t>(s - schedule_.steps.data()); };
  for (const Step* s : dense_steps) movers_[index(s)] = dense_.get();
  for (const Step* s : row_steps) movers_[index(s)] = rows_.get();
}

int64_t MoeLayer::held_bytes() const {
  int64_t b = 0;
  for (const MoeLayerParams* p : {&params_, &grads_}) b += p->bytes();
  return b + bufs_.held_bytes() + replay_stats_.bytes() + dense_->held_bytes() +
         (rows_ ? rows_->held_bytes() : 0) + backend_->held_bytes();
}

void MoeLayer::load_whole(const ref::MoeParams<float>& whole) {
  whole.check(shape_);
  const int64_t hl_shard = params_.experts.w1.dim(2);
  MoeLayerParams host =
      make_params(shape_, params_.experts.w1.dim(0), hl_shard, mp_size_, Device::kCpu);
  std::memcpy(host.wg.data(), whole.wg.data(), static_cast<size_t>(host.wg.bytes()));
  auto& x = host.experts;
  const int64_t e_loc = x.w1.dim(0), M = shape_.model_dim;
  const bool biases = has_expert_biases(shape_.expert_mlp);
  for (int64_t e = 0; e < e_loc; ++e) {
    place_ffn_part(ref::slice_expert(shape_, whole, first_expert_ + e, esp_rank_, esp_size_), e,
                   x);
    if (biases)
      std::memcpy(x.b2.data() + e * M, whole.b2.data() + (first_expert_ + e) * M,
                  static_cast<size_t>(M) * sizeof(float));
  }
  // The shared experts: this MP rank's shard of each, b2 and the shared gate whole.
  auto& sh = host.shared;
  for (int64_t s = 0; s < shape_.shared_experts; ++s) {
    place_ffn_part(ref::slice_shared(shape_, whole, s, mp_rank_, mp_size_), s, sh);
    if (biases)
      std::memcpy(sh.b2.data() + s * M, whole.sb2.data() + s * M,
                  static_cast<size_t>(M) * sizeof(float));
  }
  std::copy(whole.swg.begin(), whole.swg.end(), host.shared_gate.data());
  copy_params(host, params_);
}

void MoeLayer::store_whole_grads(ref::MoeParams<float>& whole) const {
  whole.check(shape_);
  MoeLayerParams host = make_params(shape_, grads_.experts.w1.dim(0),
                                    grads_.experts.w1.dim(2), mp_size_, Device::kCpu);
  copy_params(grads_, host);
  std::memcpy(whole.wg.data(), host.wg.data(), static_cast<size_t>(host.wg.bytes()));
  const auto& g = host.experts;
  const int64_t e_loc = g.w1.dim(0), M = shape_.model_dim;
  const bool biases = has_expert_biases(shape_.expert_mlp);
  for (int64_t e = 0; e < e_loc; ++e) {
    ref::unslice_expert(shape_, ffn_part(g, e, shape_.expert_mlp), first_expert_ + e, esp_rank_,
                        esp_size_, whole);
    if (biases)
      std::memcpy(whole.b2.data() + (first_expert_ + e) * M, g.b2.data() + e * M,
                  static_cast<size_t>(M) * sizeof(float));
  }
  // The shared experts: this MP rank's shard; b2 and the shared gate whole (every MP rank
  // holds the same complete gradients of those).
  const auto& sg = host.shared;
  for (int64_t s = 0; s < shape_.shared_experts; ++s) {
    ref::unslice_shared(shape_, ffn_part(sg, s, shape_.expert_mlp), s, mp_rank_, mp_size_, whole);
    if (biases)
      std::memcpy(whole.sb2.data() + s * M, sg.b2.data() + s * M,
                  static_cast<size_t>(M) * sizeof(float));
  }
  std::copy(host.shared_gate.data(), host.shared_gate.data() + host.shared_gate.numel(),
            whole.swg.begin());
}

void MoeLayer::zero_grad() {
  grads_.wg.zero();
  grads_.shared_gate.zero();
  for (Tensor* t : grads_.experts.all()) t->zero();
  for (Tensor* t : grads_.shared.all()) t->zero();
}

const Tensor& MoeLayer::forward(const Tensor& x) {
  bufs_.bind();
  Tensor& in = bufs_.value(schedule_.input);
  PARM_CHECK(x.numel() == in.numel(), "MoE layer input {} but the layer takes {}",
             shape_str(x.shape()), shape_str(in.shape()));
  in.copy_from(x);
  for (auto& p : fwd_phases_) p.clear();
  const bool timed = step_timed();
  if (timed) backend_->sync();
  for (size_t i = 0; i < schedule_.steps.size(); ++i) {
    if (overlaps_next(i, false)) {
      run_overlapped(i, false, 0.0f, fwd_us_);
      ++i;  // the step it overlapped
      continue;
    }
    const double t0 = timed ? now_us() : 0.0;
    run_step(schedule_.steps[i], false, 0.0f);
    if (!timed) continue;
    backend_->sync();  // a step's time includes the device work it queued
    fwd_us_[i] = now_us() - t0;
  }
  backend_->sync();
  return bufs_.value(schedule_.output);
}

void MoeLayer::set_dl_z(float dl_z) {
  PARM_CHECK(dl_z == 0.0f || schedule_.z_loss,
             "MoE layer: a router z-loss gradient (dl_z {}) for a layer built without the "
             "z-loss (construct it with router_z_loss = true)", dl_z);
  dl_z_ = dl_z;
}

void MoeLayer::replay_forward() {
  for (const Step& s : schedule_.steps) {
    if (schedule::is_collective(s.kind) || s.kind == StepKind::kAuxLoss) continue;
    const bool pooled = pooled_[static_cast<size_t>(s.out)];
    if (s.kind == StepKind::kGate) {
      // The routing and the saved probabilities again; the statistics where they are the
      // pool's, else into scratch (S1's are the summed ones: kept, not overwritten).
      run_gate(s, pooled ? bufs_.value(s.out).data() : replay_stats_.data(), nullptr);
      continue;
    }
    if (pooled) compute_forward(s, nullptr);  // else a collective's output too: kept
  }
}

void MoeLayer::begin_backward(const Tensor& dout) {
  bufs_.bind();
  if (!pooled_.empty()) replay_forward();
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (accumulated_[i]) bufs_.grad(static_cast<int>(i)).zero();
  bufs_.dweights_call().zero();
  bufs_.grad(schedule_.output).copy_from(dout);
}

const Tensor& MoeLayer::backward(const Tensor& dout, float dl_aux, float dl_z) {
  set_dl_z(dl_z);
  for (auto& p : bwd_phases_) p.clear();
  begin_backward(dout);
  const bool timed = step_timed();
  if (timed) backend_->sync();
  for (size_t i = schedule_.steps.size(); i-- > 0;) {
    if (i > 0 && overlaps_next(i - 1, true)) {
      run_overlapped(i - 1, true, dl_aux, bwd_us_);
      --i;  // the AllToAll it overlapped
      continue;
    }
    const double t0 = timed ? now_us() : 0.0;
    run_step(schedule_.steps[i], true, dl_aux);
    if (!timed) continue;
    backend_->sync();
    bwd_us_[i] = now_us() - t0;
  }
  add_weight_grads();
  backend_->sync();
  return bufs_.grad(schedule_.input);
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
  with_buffer(bufs_.value(schedule_.output), out, "output",
              [&] { forward(x); });
}

void MoeLayer::backward_into(const Tensor& dout, float dl_aux, const Tensor& dx, float dl_z) {
  PARM_CHECK(schedule_.output != schedule_.input, "MoE layer: the schedule's output is its input");
  with_buffer(bufs_.grad(schedule_.input), dx, "input gradient",
              [&] { backward(dout, dl_aux, dl_z); });
}

bool MoeLayer::overlaps_next(size_t i, bool backward) const {
  const auto& steps = schedule_.steps;
  return steps[i].overlap_next && i + 1 < steps.size() &&
         schedule::step_move(steps[i].kind, backward) == Move::kAllToAll &&
         !schedule::joins_sum(steps[i], backward) &&
         !schedule::is_collective(steps[i + 1].kind);
}

void MoeLayer::run_overlapped(size_t i, bool backward, float dl_aux, std::vector<double>& us) {
  const Step& a2a = schedule_.steps[i];
  const Step& next = schedule_.steps[i + 1];
  const double t0 = now_us();
  RequestPtr posted = movers_[i]->start_alltoall(a2a, backward);
  const double t1 = now_us();
  run_step(next, backward, dl_aux);
  backend_->sync();
  const double t2 = now_us();
  if (posted) posted->wait();
  bufs_.wait_fills();  // the fill counts posted beside it (no-op when none)
  us[i] = (t1 - t0) + (now_us() - t2);  // the AllToAll's post and wait
  us[i + 1] = t2 - t1;                  // the computation in between
}

void MoeLayer::run_step(const Step& s, bool backward, float dl_aux) {
  if (!schedule::joins_sum(s, backward)) {
    run_pass(s, backward, dl_aux);
    return;
  }
  // Forward: the value summed (a kSumDup's move); backward: the gradient (a kShareDup's).
  Tensor& t = bufs_.pass(s.joined_sum, backward);
  backend_->sync();  // the tensor is complete before the collective reads it
  RequestPtr sum = topo_.comm(s.group).iallreduce(t.data(), static_cast<size_t>(t.numel()),
                                                  DType::kF32);
  run_pass(s, backward, dl_aux);
  sum->wait();
}

void MoeLayer::run_pass(const Step& s, bool backward, float dl_aux) {
  const auto i = static_cast<size_t>(&s - schedule_.steps.data());
  Mover* m = movers_[i];
  switch (schedule::step_move(s.kind, backward)) {
    case Move::kNone: break;
    case Move::kCompute:
      // Phases only when timed: a device backend waits for the GPU at every phase it times.
      if (backward)
        compute_backward(s, dl_aux, step_timed() ? &bwd_phases_[i] : nullptr);
      else
        compute_forward(s, step_timed() ? &fwd_phases_[i] : nullptr);
      break;
    case Move::kKeepChunk: m->keep_chunk(s, backward); break;
    case Move::kAllGather: m->allgather(s, backward); break;
    case Move::kAllToAll: m->alltoall(s, backward); break;
    case Move::kReduceScatter: m->reduce_scatter(s, backward); break;
    case Move::kAllReduce: m->allreduce(s, backward); break;
    case Move::kFusedDispatch: m->fused_dispatch(s, backward); break;
    case Move::kFusedCombine: m->fused_combine(s, backward); break;
  }
}

void MoeLayer::run_gate(const Step& s, float* stats, moe::PhaseTimes* phases) {
  backend_->set_router_bias(std::any_of(router_bias_->begin(), router_bias_->end(),
                                        [](float b) { return b != 0.0f; })
                                ? router_bias_->data()
                                : nullptr);
  backend_->gate_forward(bufs_.value(s.in), params_.wg, shape_.topk, schedule_.capacity,
                         schedule_.dispatch_slots, stats, phases);
}

void MoeLayer::compute_forward(const Step& s, moe::PhaseTimes* phases) {
  const auto& sc = schedule_;
  auto buf = [&](int id) -> Tensor& { return bufs_.value(id); };
  switch (s.kind) {
    case StepKind::kGate: run_gate(s, buf(s.out).data(), phases); break;
    case StepKind::kAuxLoss:
      l_aux_ = backend_->aux_loss(buf(s.in).data(), shape_.experts, sc.total_tokens,
                                  shape_.aux_sequences());
      l_z_ = sc.z_loss ? backend_->z_loss(buf(s.in).data(), shape_.experts, sc.total_tokens,
                                          shape_.aux_sequences())
                       : 0.0f;
      break;
    case StepKind::kDispatch: {
      backend_->dispatch_forward(buf(s.in), buf(s.out));
      const auto& fill = backend_->fill();
      bufs_.fills(s.out).assign(fill.begin(), fill.end());
      break;
    }
    case StepKind::kExperts: {
      const int64_t segments = sc.expert_blocks * params_.experts.w1.dim(0);
      PARM_CHECK(static_cast<int64_t>(bufs_.fills(s.in).size()) == segments,
                 "experts' input has {} fill counts, expected {}", bufs_.fills(s.in).size(),
                 segments);
      backend_->experts_forward(buf(s.in), params_.experts, sc.expert_blocks,
                                sc.exchange_slots, bufs_.fills(s.in).data(), bufs_.starts(s.in),
                                sc.adds_b2, buf(s.out), phases);
      break;
    }
    case StepKind::kCombine: backend_->combine_forward(buf(s.in), buf(s.out)); break;
    case StepKind::kSharedExperts:
      backend_->shared_forward(buf(s.in), params_.shared, params_.shared_gate, mp_rank_ == 0,
                               buf(s.out), phases);
      break;
    case StepKind::kAddShared:
      backend_->add(buf(s.out).data(), buf(s.in).data(), buf(s.in).numel());
      break;
    default: PARM_CHECK(false, "step '{}' is not a computation", s.label);
  }
}

void MoeLayer::compute_backward(const Step& s, float dl_aux, moe::PhaseTimes* phases) {
  const auto& sc = schedule_;
  auto buf = [&](int id) -> Tensor& { return bufs_.value(id); };
  auto dbuf = [&](int id) -> Tensor& { return bufs_.grad(id); };
  switch (s.kind) {
    case StepKind::kGate:
      backend_->gate_backward(buf(s.in), params_.wg, dbuf(s.out).data(), bufs_.dwg_call(),
                              dbuf(s.in), phases);
      break;
    case StepKind::kAuxLoss:
      backend_->aux_loss_backward(buf(s.in).data(), shape_.experts, sc.total_tokens,
                                  shape_.aux_sequences(), dl_aux,
                                  dl_z_, dbuf(s.in).data());
      break;
    case StepKind::kDispatch: backend_->dispatch_backward(dbuf(s.out), dbuf(s.in)); break;
    case StepKind::kExperts:
      // --recompute moe-act: the experts' forward again, from its input buffer (kept: a
      // collective's output, or the dispatch's), to refill the activation rows the pool shares
      // with other layers. It writes the output buffer with the bits the forward wrote there.
      if (recompute_experts_)
        backend_->experts_forward(buf(s.in), params_.experts, sc.expert_blocks,
                                  sc.exchange_slots, bufs_.fills(s.in).data(),
                                  bufs_.starts(s.in), sc.adds_b2, buf(s.out), phases);
      // dout and din have the input's counts, so its segment starts.
      backend_->experts_backward(dbuf(s.out), params_.experts, sc.expert_blocks,
                                 sc.exchange_slots, bufs_.fills(s.in).data(), bufs_.starts(s.in),
                                 grads_.experts, dbuf(s.in), phases);
      break;
    case StepKind::kCombine:
      backend_->combine_backward(buf(s.in), dbuf(s.out), dbuf(s.in));
      break;
    case StepKind::kSharedExperts:  // dx accumulates: the gate and the dispatch read x too
      backend_->shared_backward(buf(s.in), dbuf(s.out), params_.shared, params_.shared_gate,
                                grads_.shared, bufs_.dsg_call(), dbuf(s.in), phases);
      break;
    case StepKind::kAddShared: dbuf(s.in).copy_from(dbuf(s.out)); break;
    default: PARM_CHECK(false, "step '{}' is not a computation", s.label);
  }
}

void MoeLayer::add_weight_grads() {
  backend_->add(grads_.wg.data(), bufs_.dwg_call().data(), grads_.wg.numel());
  if (!grads_.shared_gate.empty())
    backend_->add(grads_.shared_gate.data(), bufs_.dsg_call().data(),
                  grads_.shared_gate.numel());
}

}  // namespace parm
