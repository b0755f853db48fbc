#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>

#include <fmt/ranges.h>

#include "core/fault.h"
#include "data/batches.h"
#include "kernels/cpu/kernels.h"
#include "moe/load_balance.h"
#include "moe/phase_times.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"
#include "model/dense_ops.h"
#include "model/pp_split.h"
#include "train/checkpoint.h"
#include "perfmodel/model.h"
#include "train/loss_chart.h"
#include "train/pipeline.h"
#include "train/schedule_plan.h"

namespace parm::train {
namespace {

// GEMM rate per rank (GFLOP/s) for MFU. On the CPU: the calibrated expert-GEMM rate of the profile
// (measured with every rank of the machine busy), else measured now, all ranks at once for
// about 50 ms so that ranks sharing cores see it. At bf16 the products run the bf16 kernel,
// several times faster than fp32 (AMX): the rate is that kernel's, measured now (profiles
// hold fp32 rates).
// On a device: the device's product at the run's precision (model::dense_ops' gemm, the
// one the dense layers run), 4096^3, measured now by every rank at once (ranks sharing a GPU
// see their share).
double device_gemm_gflops(Device device, Precision precision, Communicator& world) {
  const model::DenseOps& ops = model::dense_ops(device);
  const int64_t n = 4096;
  Tensor host({n, n});
  host.fill(0.5f);
  const Tensor a = host.to(device), b = host.to(device);
  Tensor c({n, n}, device);
  const auto product = [&] { ops.gemm(precision, false, false, n, n, n, a.data(), b.data(), c.data(), false); };
  product();  // warm up (and the library's first-call setup)
  device_sync();
  world.barrier();
  const int reps = 20;
  const double t0 = now_us();
  for (int i = 0; i < reps; ++i) product();
  device_sync();
  double rate = 2.0 * n * n * n * reps / ((now_us() - t0) * 1e3);
  world.allreduce(&rate, 1);
  return rate / world.size();
}

double gemm_gflops_for_mfu(const std::string& profile, Precision precision, Device device,
                           Communicator& world, std::string& source) {
  if (device != Device::kCpu) {
    source = fmt::format("{} {} GEMM measured at start", device_name(device),
                         precision_name(precision));
    return device_gemm_gflops(device, precision, world);
  }
  const bool bf16 = precision == Precision::kBf16;
  if (!profile.empty() && !bf16) {
    source = "calibrated, " + profile;
    return perfmodel::read_profile(profile).gemm_fit(perfmodel::GemmClass::kExpertNN).gflops;
  }
  source = bf16 ? fmt::format("bf16 GEMM measured at start, {}", cpu::bf16_kernel_name())
                : "measured at start";
  const int64_t n = 384;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  cpu::Bf16Buffer pa(static_cast<size_t>(cpu::bf16_packed_a_size(n, n)));
  cpu::Bf16Buffer pb(static_cast<size_t>(cpu::bf16_packed_b_size(n, n)));
  cpu::bf16_pack_a(false, n, n, a.data(), n, pa.data());
  cpu::bf16_pack_b(false, n, n, b.data(), n, pb.data());
  const auto product = [&] {
    if (bf16)
      cpu::gemm_bf16_packed(n, n, n, pa.data(), pb.data(), c.data(), n, false);
    else
      cpu::gemm(false, false, n, n, n, a.data(), b.data(), c.data(), false);
  };
  product();  // warm up
  world.barrier();
  const double t0 = now_us();
  int reps = 0;
  for (; reps < 1000 && now_us() - t0 < 5e4; ++reps) product();
  double rate = 2.0 * n * n * n * reps / ((now_us() - t0) * 1e3);
  world.allreduce(&rate, 1);
  return rate / world.size();
}

// One line per pipeline stage (collective over the world; printed on world rank 0): the world
// ranks it runs on (so that a rank named by a failure maps to its stage), its blocks, its
// activation slots and the memory it holds for them, and its parameters with their gradients
// and AdamW moments (4 copies).
void print_stages(Topology& topo, model::Model& model, const std::vector<model::Param*>& params,
                  int num_micro, bool print) {
  const model::StageBlocks& s = model.stage();
  int64_t param_bytes = 0;
  for (const auto* p : params) param_bytes += 4 * p->value.bytes();
  Communicator& pp = topo.host_comm(Group::kPp);
  std::vector<double> mine = {static_cast<double>(s.begin), static_cast<double>(s.end),
                              static_cast<double>(model.activation_bytes()),
                              static_cast<double>(param_bytes)};
  std::vector<double> all(mine.size() * static_cast<size_t>(pp.size()));
  pp.allgather(mine.data(), all.data(), mine.size());
  if (!print) return;
  const Layout& lay = topo.layout();
  for (int k = 0; k < pp.size(); ++k) {
    std::vector<int> ranks;
    for (int r = 0; r < lay.world; ++r)
      if (stage_of(lay, r) == k) ranks.push_back(r);
    const double* v = all.data() + k * mine.size();
    std::printf("pp stage %d of %d (world ranks %s): blocks %g..%g%s%s, %d activation slots "
                "%.2f MiB, parameters + grads + AdamW %.2f MiB\n",
                k, pp.size(), fmt::format("{}", fmt::join(ranks, ",")).c_str(), v[0], v[1] - 1,
                k == 0 ? " + embeddings" : "", k == pp.size() - 1 ? " + head" : "",
                pipeline_slots(k, pp.size(), num_micro), v[2] / (1 << 20), v[3] / (1 << 20));
  }
}

// The MoE blocks before this pipeline stage's first block.
int64_t moe_blocks_before(model::Model& m, const model::ModelConfig& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < m.stage().begin; ++i) n += model::is_moe_block(c, i) ? 1 : 0;
  return n;
}

// Per MoE layer of the whole model, the routing imbalance of its last loads (`loads`: this
// stage's layers' expert_loads), the same on every rank: each stage puts in its own layers,
// -inf elsewhere, and a max over the world picks them, so that every rank plans from the
// same numbers.
std::vector<double> measured_load_max_over_mean(Communicator& world, model::Model& m,
                                                const model::ModelConfig& c, const Layout& lay,
                                                const std::vector<std::vector<double>>& loads) {
  std::vector<double> v(static_cast<size_t>(model::num_moe_blocks(c)),
                        -std::numeric_limits<double>::infinity());
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  for (size_t l = 0; l < loads.size(); ++l)
    v[first + l] = routed_load_max_over_mean(loads[l], lay.ep);
  world.allreduce(v.data(), v.size(), ReduceOp::kMax);
  return v;
}

// A model built with `schedules` that takes over `old`'s parameters, AdamW moments, step
// count and router bias: the step lists change, no number does.
struct Rebuilt {
  std::unique_ptr<model::Model> model;
  std::vector<model::Param*> params;
  AdamW opt;
};
Rebuilt rebuild_model(Topology& topo, const model::ModelConfig& c,
                      const std::vector<model::LayerSchedule>& schedules, int64_t micro,
                      Precision precision, const model::PipelineOptions& pipe, model::Model& old,
                      const std::vector<model::Param*>& params, AdamW& opt) {
  auto m = model::make_model(topo, c, schedules, micro, precision, pipe);
  auto mp = m->params();
  AdamW mopt(mp);
  PARM_CHECK_EQ(mp.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    PARM_CHECK(mp[i]->name == params[i]->name && mp[i]->value.numel() == params[i]->value.numel(),
               "rebuilt model: parameter {} is {} ({} elements), was {} ({})", i, mp[i]->name,
               mp[i]->value.numel(), params[i]->name, params[i]->value.numel());
    mp[i]->value.copy_from(params[i]->value);
    mopt.first_moments()[i].copy_from(opt.first_moments()[i]);
    mopt.second_moments()[i].copy_from(opt.second_moments()[i]);
  }
  mopt.set_steps_taken(opt.steps_taken());
  const auto from = old.moe_layers(), to = m->moe_layers();
  PARM_CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i]->router_bias() = from[i]->router_bias();
  return {std::move(m), std::move(mp), std::move(mopt)};
}

// The router bias of every MoE layer of the whole model (in block order, E numbers each),
// the same on every rank: each stage puts in its own layers, -inf elsewhere, and a max over
// the world picks them unchanged (a max moves no bits: resume is exact).
nlohmann::json gather_router_bias(Communicator& world, model::Model& m,
                                  const model::ModelConfig& c) {
  const auto E = static_cast<size_t>(c.experts);
  const auto n = static_cast<size_t>(model::num_moe_blocks(c));
  std::vector<double> v(n * E, -std::numeric_limits<double>::infinity());
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  const auto layers = m.moe_layers();
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t e = 0; e < E; ++e) v[(first + l) * E + e] = layers[l]->router_bias()[e];
  world.allreduce(v.data(), v.size(), ReduceOp::kMax);
  nlohmann::json out = nlohmann::json::array();
  for (size_t l = 0; l < n; ++l) out.push_back(std::vector<double>(v.begin() + l * E, v.begin() + (l + 1) * E));
  return out;
}

// Sets this stage's MoE layers' router bias from a checkpoint's (null: none saved, the
// bias stays zero).
void set_router_bias(model::Model& m, const model::ModelConfig& c, const nlohmann::json& saved,
                     const std::string& where) {
  if (saved.is_null()) return;
  const int64_t n = model::num_moe_blocks(c);
  bool ok = saved.is_array() && static_cast<int64_t>(saved.size()) == n;
  for (size_t l = 0; ok && l < saved.size(); ++l)
    ok = saved[l].is_array() && static_cast<int64_t>(saved[l].size()) == c.experts;
  PARM_CONFIG_CHECK(ok, "checkpoint {}: router_bias must hold {} MoE layers of {} numbers, got {}",
                    where, n, c.experts, saved.dump().substr(0, 200));
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  const auto layers = m.moe_layers();
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t e = 0; e < static_cast<size_t>(c.experts); ++e)
      layers[l]->router_bias()[e] = static_cast<float>(saved[first + l][e].get<double>());
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, bool verbose) {
  validate(cfg);
  TopologyOptions topt;
  topt.mp = cfg.parallel.mp;
  topt.ep = cfg.parallel.ep;
  topt.esp = cfg.parallel.esp;
  topt.pp = cfg.parallel.pp;
  topt.order = cfg.parallel.order;
  topt.ranks_per_node = cfg.parallel.ranks_per_node;
  topt.timeout_s = cfg.parallel.timeout_s;
  topt.device = parse_device(cfg.parallel.device);
  topt.comm = parse_comm_backend(cfg.parallel.comm);
  auto topo = Topology::create(topt);
  const Layout& lay = topo->layout();
  // Every rank refuses alike, before any work.
  PARM_CONFIG_CHECK(lay.pp == 1 || std::string(topo->comm_backend()) != "nccl",
                    "--pp {} with --comm nccl: the pipeline's activations and gradients travel "
                    "as tagged point-to-point messages, which NCCL cannot match by tag; use "
                    "--comm mpi (device buffers staged through host memory) or --pp 1",
                    lay.pp);
  const bool root = topo->world_rank() == 0;
  const int dp = lay.dp, dp_rank = topo->host_comm(Group::kDp).rank();
  Communicator& world = topo->host_comm(Group::kWorld);

  std::optional<perfmodel::Profile> cost_profile;  // read once, by the first plan
  auto schedules = choose_schedules(cfg, *topo, {}, "", verbose, cost_profile);
  const data::Corpus corpus =
      data::load_corpus(cfg.data.corpus, cfg.data.val_fraction, cfg.model.seq_len);
  const data::BatchSource source(corpus,
                                 cfg.model.arch == model::Arch::kGpt2 ? data::Objective::kCausal
                                                                      : data::Objective::kMasked,
                                 cfg.model.seq_len, cfg.model.seed);
  const int pp = lay.pp;
  const int stage = topo->host_comm(Group::kPp).rank();
  const int64_t accum = cfg.loop.grad_accum, micro = cfg.loop.micro_batch;
  model::PipelineOptions pipe;
  pipe.split = model::parse_pp_split(cfg.parallel.pp_split, pp, cfg.model.num_layers);
  pipe.slots = pipeline_slots(stage, pp, static_cast<int>(accum));
  auto model = model::make_model(*topo, cfg.model, schedules, micro,
                                 parse_precision(cfg.parallel.precision), pipe);
  auto params = model->params();
  const auto all_params = model->all_param_specs();
  std::unique_ptr<PipelineRunner> pipeline;
  if (pp > 1)
    pipeline = std::make_unique<PipelineRunner>(*topo, *model, static_cast<int>(accum),
                                                cfg.parallel.pp_overlap == "on");
  AdamW opt(params);
  Tensor grad_flat;  // reduce_gradients' flat buffer, kept across steps
  const nlohmann::json model_json = model_config_json(cfg.model);

  TrainResult result;
  // Every MoE layer's, also those of other pipeline stages (model->schedules() has this
  // stage's).
  result.schedules = schedule_names(schedules, cfg, lay);
  std::string gemm_source;
  result.gemm_gflops = gemm_gflops_for_mfu(cfg.loop.profile,
                                           parse_precision(cfg.parallel.precision),
                                           topo->device(), world, gemm_source);

  int64_t step = 0, data_position = 0;
  if (!cfg.loop.resume.empty()) {
    const CheckpointState st =
        load_checkpoint(*topo, cfg.loop.resume, all_params, params, opt, model_json);
    step = st.step;
    data_position = st.data_position;
    set_router_bias(*model, cfg.model, st.router_bias, cfg.loop.resume);
    if (root && verbose)
      std::printf("resumed from %s at step %lld (%lld sequences consumed)\n",
                  cfg.loop.resume.c_str(), static_cast<long long>(step),
                  static_cast<long long>(data_position));
  }
  OptimConfig optim = cfg.optim;
  optim.total_steps = cfg.loop.steps;
  const int64_t global_batch = micro * accum * dp;
  const int64_t tokens_per_step = global_batch * cfg.model.seq_len;

  std::FILE* metrics = nullptr;
  if (root && !cfg.loop.metrics.empty()) {
    metrics = std::fopen(cfg.loop.metrics.c_str(), cfg.loop.resume.empty() ? "w" : "a");
    PARM_CHECK(metrics != nullptr, "cannot open metrics file {}", cfg.loop.metrics);
  }
  if (root && verbose) {
    std::printf("parm train %s: %s, %lld layers (MoE every %d: %s), M=%lld, E=%lld k=%d f=%s\n",
                cfg.name.c_str(), cfg.model.arch == model::Arch::kGpt2 ? "GPT-2" : "BERT",
                static_cast<long long>(cfg.model.num_layers), cfg.model.moe_every,
                fmt::format("{}", fmt::join(result.schedules, ",")).c_str(),
                static_cast<long long>(cfg.model.model_dim),
                static_cast<long long>(cfg.model.experts), cfg.model.topk,
                cfg.model.capacity_factor.c_str());
    std::printf("layout: %d ranks, pp=%d x (dp=%d mp=%d | edp=%d ep=%d esp=%d), order %s; global "
                "batch %lld x %lld tokens; corpus %s (%zu train / %zu val bytes); MFU against "
                "%.1f GFLOP/s per rank (%s)\n",
                lay.world, lay.pp, lay.dp, lay.mp, lay.edp, lay.ep, lay.esp,
                lay.order_name().c_str(),
                static_cast<long long>(global_batch), static_cast<long long>(cfg.model.seq_len),
                corpus.name.c_str(), corpus.train.size(), corpus.val.size(), result.gemm_gflops,
                gemm_source.c_str());
  }
  if (pp > 1) print_stages(*topo, *model, params, static_cast<int>(accum), root && verbose);

  auto evaluate = [&]() {
    double sums[2] = {0.0, 0.0};
    for (int64_t i = 0; i < cfg.loop.eval_batches; ++i) {
      const model::Batch b = source.val_batch(i * dp + dp_rank, micro);
      const auto parts = pipeline ? pipeline->forward(b) : model->forward(b);
      sums[0] += parts.lm_loss_sum;
      sums[1] += static_cast<double>(parts.num_targets);
    }
    if (pipeline) topo->host_comm(Group::kPp).allreduce(sums, 2);  // the last stage's
    topo->host_comm(Group::kDp).allreduce(sums, 3);
    return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  };

  // --phase-times: the model's phases and the step's tail, per step (world rank 0's).
  moe::PhaseTimes phases;
  if (cfg.loop.phase_times) model->time_phases(&phases);
  const auto phase_lap = [&](const char* name, double& t) {
    if (!cfg.loop.phase_times) return;
    if (topo->device() != Device::kCpu) device_sync();
    const double now = now_us();
    phases.add(name, now - t);
    t = now;
  };
  std::string schedules_line = fmt::format("{}", fmt::join(result.schedules, ","));
  // --schedule / --fuse auto price a balanced router first; the first report step's
  // measured routing prices them again, once.
  bool replan_pending = plans_schedules(cfg);
  const double run_t0 = now_us();
  std::vector<std::vector<double>> layer_loads;  // expert_loads per MoE layer, of this step
  // Model FLOPs of one step summed over the ranks: fixed by the configuration and the
  // layout, so reduced once here rather than every step (a re-plan keeps both).
  const double total_flops = [&] {
    double f = model->flops_per_step(micro * cfg.model.seq_len) * static_cast<double>(accum);
    world.allreduce(&f, 1);
    return f;
  }();
  // The expert weights change only at opt.step below (loads happen before this loop): a GPU
  // layer at bf16 rounds them once per step, not once per micro-batch.
  uint64_t weights_version = 1;
  // The model hands it to the dense weights' packs and its MoE experts, at every step's start
  // (a re-plan may have built a new model) and right after the optimizer step, so that an
  // evaluation between steps reads the new weights.
  for (; step < cfg.loop.steps; ++step) {
    fault::at_training_step(topo->world_rank(), step);
    const double t0 = now_us();
    for (auto* p : params) p->grad.zero();
    phases.clear();
    model->set_weights_version(weights_version);
    std::vector<model::Batch> batches;
    for (int64_t a = 0; a < accum; ++a) {
      const int64_t j = a * dp + dp_rank;
      batches.push_back(source.train_batch(data_position + j * micro, micro));
    }
    // The global batch's targets, counted here rather than summed over dp (one collective
    // less per step): the step's micro-batches are sequences [data_position, + global_batch).
    const double counts[1] = {
        static_cast<double>(source.train_targets(data_position, global_batch))};
    double sums[3] = {0.0, 0.0, 0.0};  // lm loss sum, aux loss sum, z-loss sum
    double comm_us = 0.0, compute_us = 0.0, bubble_us = 0.0;
    if (pipeline) {
      // The stage's time not spent waiting for its neighbours counts as compute.
      const double tp0 = now_us();
      const auto parts = pipeline->run(batches, std::max(1.0, counts[0]), 1.0f);
      bubble_us = pipeline->last_recv_wait_us();
      sums[0] = parts.lm_loss_sum;
      sums[1] = parts.aux_loss;
      sums[2] = parts.z_loss;
      comm_us += bubble_us;
      compute_us += now_us() - tp0 - bubble_us;
      topo->host_comm(Group::kPp).allreduce(sums, 3);  // lm: the last stage's; aux: every stage's
    } else {
      for (const auto& b : batches) {
        const auto parts = model->forward_backward(b, std::max(1.0, counts[0]), 1.0f);
        sums[0] += parts.lm_loss_sum;
        sums[1] += parts.aux_loss;
        sums[2] += parts.z_loss;
        comm_us += model->last_comm_us();
        compute_us += model->last_compute_us();
      }
    }
    const double t_sync = now_us();
    double t_phase = t_sync;  // the model's last phase waited for the device
    model->sum_tied_grads();
    reduce_gradients(*topo, params, &grad_flat);
    phase_lap("grad-reduce", t_phase);
    const double norm = global_grad_norm(*topo, params);
    phase_lap("grad-norm", t_phase);
    const double clip =
        optim.grad_clip > 0 && norm > optim.grad_clip ? optim.grad_clip / (norm + 1e-6) : 1.0;
    const double lr = lr_at(optim, step);
    opt.step(optim, lr, clip);
    ++weights_version;
    model->set_weights_version(weights_version);
    phase_lap("optimizer", t_phase);
    const bool last = step + 1 == cfg.loop.steps;
    const bool report = (step + 1) % cfg.loop.log_every == 0 || last;
    // The expert loads of the step's last micro-batch, per MoE layer (collective): computed
    // once, here with the router bias (DeepSeek-V3's update, from them) or for the report
    // below, which shares them.
    const auto moe_layers = model->moe_layers();
    layer_loads.resize(moe_layers.size());
    auto compute_loads = [&] {
      for (size_t i = 0; i < moe_layers.size(); ++i)
        layer_loads[i] = expert_loads(*topo, *moe_layers[i]);
    };
    const bool bias_update = cfg.model.router_bias_update > 0;
    if (bias_update) {
      compute_loads();
      for (size_t i = 0; i < moe_layers.size(); ++i)
        update_router_bias(*moe_layers[i], layer_loads[i], cfg.model.router_bias_update);
    }
    comm_us += now_us() - t_sync;
    data_position += global_batch;
    topo->host_comm(Group::kDp).allreduce(sums, 3);
    const double step_us = now_us() - t0;

    StepMetrics m;
    m.step = step + 1;
    m.loss = sums[0] / std::max(1.0, counts[0]);
    m.aux_loss = sums[1] / static_cast<double>(accum * dp);
    m.z_loss = sums[2] / static_cast<double>(accum * dp);
    m.lr = lr;
    m.grad_norm = norm;
    double times[3] = {step_us, comm_us, compute_us};
    world.allreduce(times, 3, ReduceOp::kMax);
    m.step_ms = times[0] / 1e3;
    m.comm_ms = times[1] / 1e3;
    m.compute_ms = times[2] / 1e3;
    if (pipeline) {
      // The mean over ranks of the share of the step each spent waiting on pp.recv.
      double share = bubble_us / step_us;
      double moe_us = pipeline->last_moe_comm_us();
      world.allreduce(&share, 1);
      world.allreduce(&moe_us, 1);
      m.bubble = share / lay.world;
      m.moe_comm_ms = moe_us / lay.world / 1e3;
    }
    m.tokens_per_s = static_cast<double>(tokens_per_step) / (times[0] / 1e6);
    m.mfu = total_flops / (times[0] / 1e6) / (result.gemm_gflops * 1e9 * lay.world);
    // The load imbalance of this step's last micro-batch, worst over the MoE layers
    // (collective: every rank, before evaluation routes other tokens).
    LoadImbalance imbalance;
    if (report && !bias_update) compute_loads();
    if (report)
      for (size_t i = 0; i < moe_layers.size(); ++i) {
        const LoadImbalance li = load_imbalance(*topo, *moe_layers[i], layer_loads[i]);
        auto& worst = imbalance;
        worst.expert_max_over_mean = std::max(worst.expert_max_over_mean, li.expert_max_over_mean);
        worst.rank_max_over_mean = std::max(worst.rank_max_over_mean, li.rank_max_over_mean);
      }
    if (report) {  // the worst stage's, on every rank
      double worst[2] = {imbalance.expert_max_over_mean, imbalance.rank_max_over_mean};
      world.allreduce(worst, 2, ReduceOp::kMax);
      imbalance = {worst[0], worst[1]};
    }
    if ((cfg.loop.eval_every > 0 && (step + 1) % cfg.loop.eval_every == 0) || last)
      m.val_loss = evaluate();
    if (last) result.final_val_loss = m.val_loss;

    if (root) {
      result.history.push_back(m);
      if (verbose && ((step + 1) % cfg.loop.log_every == 0 || last || m.val_loss >= 0)) {
        std::string val = m.val_loss >= 0 ? fmt::format(" val {:.4f}", m.val_loss) : "";
        const std::string bubble =
            pipeline ? fmt::format("  bubble {:.1f}% (1F1B {:.1f}%)  moe-comm {:.1f} ms",
                                   100.0 * m.bubble,
                                   100.0 * one_f_one_b_bubble(pp, static_cast<int>(accum)),
                                   m.moe_comm_ms)
                     : "";
        const std::string z =
            cfg.model.router_z_loss > 0 ? fmt::format("  z {:.4f}", m.z_loss) : "";
        std::printf("step %5lld/%lld  loss %.4f%s  aux %.4f%s  lr %.2e  |g| %.3f  %7.0f tok/s  "
                    "%7.1f ms (comm %.1f, compute %.1f)  MFU %.1f%%%s  moe %s  load %s\n",
                    static_cast<long long>(m.step), static_cast<long long>(cfg.loop.steps),
                    m.loss, val.c_str(), m.aux_loss, z.c_str(), m.lr, m.grad_norm, m.tokens_per_s,
                    m.step_ms, m.comm_ms, m.compute_ms, 100.0 * m.mfu, bubble.c_str(),
                    schedules_line.c_str(), imbalance.str().c_str());
        if (cfg.loop.phase_times) {
          std::string line;
          for (int i = 0; i < phases.num; ++i)
            line += fmt::format("  {} {:.1f}", phases.names[i], phases.us[i] / 1e3);
          std::printf("        phases (ms, world rank 0):%s\n", line.c_str());
        }
        std::fflush(stdout);
      }
      if (metrics != nullptr) {
        nlohmann::json line = {{"step", m.step},       {"loss", m.loss},
                               {"aux_loss", m.aux_loss}, {"lr", m.lr},
                               {"grad_norm", m.grad_norm}, {"step_ms", m.step_ms},
                               {"comm_ms", m.comm_ms}, {"compute_ms", m.compute_ms},
                               {"tokens_per_s", m.tokens_per_s}, {"mfu", m.mfu}};
        if (m.val_loss >= 0) line["val_loss"] = m.val_loss;
        if (cfg.model.router_z_loss > 0) line["z_loss"] = m.z_loss;
        if (pipeline) {
          line["bubble"] = m.bubble;
          line["bubble_1f1b"] = one_f_one_b_bubble(pp, static_cast<int>(accum));
          line["moe_comm_ms"] = m.moe_comm_ms;
        }
        if (cfg.loop.phase_times) {
          nlohmann::json ph = nlohmann::json::object();
          for (int i = 0; i < phases.num; ++i) ph[phases.names[i]] = phases.us[i] / 1e3;
          line["phase_ms"] = ph;
        }
        if (imbalance.expert_max_over_mean > 0) {
          line["load_expert_max_over_mean"] = imbalance.expert_max_over_mean;
          line["load_rank_max_over_mean"] = imbalance.rank_max_over_mean;
        }
        const std::string text = line.dump() + "\n";
        std::fwrite(text.data(), 1, text.size(), metrics);  // one write per line
        std::fflush(metrics);
      }
    }
    if (replan_pending && report && !last) {
      replan_pending = false;
      const auto lambdas = measured_load_max_over_mean(world, *model, cfg.model, lay, layer_loads);
      const std::string prefix = fmt::format("re-plan after step {}: ", step + 1);
      auto next = choose_schedules(cfg, *topo, lambdas, prefix, verbose, cost_profile);
      const bool same = std::equal(next.begin(), next.end(), schedules.begin(),
                                   [](const auto& x, const auto& y) {
                                     return x.kind == y.kind && x.fuse == y.fuse;
                                   });
      if (!same) {
        Rebuilt r = rebuild_model(*topo, cfg.model, next, micro,
                                  parse_precision(cfg.parallel.precision), pipe, *model, params,
                                  opt);
        pipeline.reset();
        model = std::move(r.model);
        params = std::move(r.params);
        opt = std::move(r.opt);
        if (pp > 1)
          pipeline = std::make_unique<PipelineRunner>(*topo, *model, static_cast<int>(accum),
                                                      cfg.parallel.pp_overlap == "on");
        if (cfg.loop.phase_times) model->time_phases(&phases);
      }
      const std::string before = schedules_line;
      schedules = std::move(next);
      result.schedules = schedule_names(schedules, cfg, lay);
      schedules_line = fmt::format("{}", fmt::join(result.schedules, ","));
      if (root && verbose) {
        std::printf("re-plan after step %lld: MoE schedules %s -> %s (%s)\n",
                    static_cast<long long>(step + 1), before.c_str(), schedules_line.c_str(),
                    same ? "kept" : "switched");
        std::fflush(stdout);
      }
    }
    const bool save_now = !cfg.loop.save_dir.empty() &&
                          ((cfg.loop.save_every > 0 && (step + 1) % cfg.loop.save_every == 0) ||
                           last);
    if (save_now) {
      const nlohmann::json bias = cfg.model.router_bias_update > 0
                                      ? gather_router_bias(world, *model, cfg.model)
                                      : nlohmann::json();
      const std::string where = save_checkpoint(*topo, cfg.loop.save_dir, all_params, params,
                                                opt, {step + 1, data_position, model_json, bias});
      if (root && verbose) std::printf("saved %s\n", where.c_str());
    }
  }
  if (metrics != nullptr) std::fclose(metrics);
  if (root && verbose) {
    const double secs = (now_us() - run_t0) / 1e6;
    std::printf("\n%-28s %s\n", "summary", cfg.name.c_str());
    if (!result.history.empty()) {
      const auto& f = result.history.front();
      const auto& l = result.history.back();
      double tps = 0.0;
      for (const auto& h : result.history) tps += h.tokens_per_s;
      std::printf("%-28s %.4f -> %.4f\n", "train loss (first -> last)", f.loss, l.loss);
      std::printf("%-28s %.4f\n", "validation loss (final)", result.final_val_loss);
      std::printf("%-28s %.0f\n", "tokens/s (mean)", tps / static_cast<double>(result.history.size()));
      std::printf("%-28s %.1f (comm %.1f)\n", "ms per step (last)", l.step_ms, l.comm_ms);
      std::printf("%-28s %.1f%%\n", "MFU (last)", 100.0 * l.mfu);
    }
    std::printf("%-28s %s\n", "MoE schedules", fmt::format("{}", fmt::join(result.schedules, ",")).c_str());
    std::printf("%-28s %.1f s\n", "wall time", secs);
  }
  if (root && !result.history.empty()) {
    std::string chart = cfg.loop.chart;
    if (chart.empty() && !cfg.loop.metrics.empty()) chart = cfg.loop.metrics + ".svg";
    if (!chart.empty()) {
      write_file_atomic(chart, loss_chart_svg(result.history, cfg.name));
      if (verbose) std::printf("%-28s %s\n", "loss chart", chart.c_str());
    }
  }
  return result;
}

}  // namespace parm::train
