#include "train/trainer.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include <fmt/ranges.h>

#include "model/pp_split.h"
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/memory.h"
#include "parm/timer.h"
#include "train/checkpoint.h"
#include "train/loss_chart.h"
#include "train/memory_check.h"
#include "train/moe_across_stages.h"
#include "train/pipeline_schedule.h"
#include "train/run_report.h"
#include "train/schedule_plan.h"

namespace parm::train {
namespace {

// The config with model.vocab from its tokenizer, validated.
TrainConfig resolved(TrainConfig cfg) {
  apply_tokenizer_vocab(cfg);
  validate(cfg);
  return cfg;
}

// The sequences the run has left to read: steps left x global batch (refused when it
// overflows int64).
int64_t sequences_ahead(int64_t steps_left, int64_t global_batch) {
  int64_t n = 0;
  PARM_CONFIG_CHECK(!__builtin_mul_overflow(std::max<int64_t>(steps_left, 0), global_batch, &n),
                    "train.steps: {} steps of {} sequences overflow the sequence numbers (int64)",
                    steps_left, global_batch);
  return n;
}

std::unique_ptr<Topology> create_topology(const TrainConfig& cfg) {
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
  check_memory_limit(cfg, topo->layout());  // every rank alike, before any work
  // Every rank refuses alike, before any work.
  PARM_CONFIG_CHECK(topo->layout().pp == 1 || std::string(topo->comm_backend()) != "nccl",
                    "--pp {} with --comm nccl: the pipeline's activations and gradients travel "
                    "as tagged point-to-point messages, which NCCL cannot match by tag; use "
                    "--comm mpi (device buffers staged through host memory) or --pp 1",
                    topo->layout().pp);
  return topo;
}

model::PipelineOptions pipeline_options(const TrainConfig& cfg, Topology& topo) {
  model::PipelineOptions pipe;
  const int pp = topo.layout().pp;
  pipe.split = model::parse_pp_split(cfg.parallel.pp_split, pp, cfg.model.num_layers);
  pipe.slots = pipeline_slots(topo.host_comm(Group::kPp).rank(), pp,
                              static_cast<int>(cfg.loop.grad_accum));
  pipe.recompute = model::parse_recompute(cfg.loop.recompute);
  pipe.lanes = pipeline_lanes(pp, cfg.parallel.pp_overlap);
  return pipe;
}

std::unique_ptr<PipelineRunner> make_pipeline(const TrainConfig& cfg, Topology& topo,
                                              model::Model& model) {
  if (topo.layout().pp == 1) return nullptr;
  return std::make_unique<PipelineRunner>(topo, model, static_cast<int>(cfg.loop.grad_accum),
                                          cfg.parallel.pp_overlap == "on");
}

data::Objective objective(const TrainConfig& cfg) {
  return cfg.model.arch == model::Arch::kGpt2 ? data::Objective::kCausal
                                              : data::Objective::kMasked;
}

OptimConfig optim_config(const TrainConfig& cfg) {
  OptimConfig optim = cfg.optim;
  optim.total_steps = cfg.loop.steps;
  return optim;
}

// The optimizer, its state counted as such (parm/memory.h).
AdamW make_adamw(Topology& topo, const std::vector<model::Param*>& params,
                 OptimizerSharding sharding) {
  MemoryKindScope kind(MemoryKind::kOptimizer);
  return AdamW(topo, params, sharding);
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
  AdamW mopt = make_adamw(topo, mp, opt.sharding());
  PARM_CHECK_EQ(mp.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    PARM_CHECK(mp[i]->name == params[i]->name && mp[i]->value.numel() == params[i]->value.numel(),
               "rebuilt model: parameter {} is {} ({} elements), was {} ({})", i, mp[i]->name,
               mp[i]->value.numel(), params[i]->name, params[i]->value.numel());
    mp[i]->value.copy_from(params[i]->value);
  }
  mopt.scatter_moments(opt.gather_moments());
  mopt.set_steps_taken(opt.steps_taken());
  const auto from = old.moe_layers(), to = m->moe_layers();
  PARM_CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i]->router_bias() = from[i]->router_bias();
  return {std::move(m), std::move(mp), std::move(mopt)};
}

// One line: where the AdamW state lives and the most moment bytes a rank holds, against the
// most it would hold unsharded (collective over the world).
void print_optimizer_state(Communicator& world, const Layout& lay, const AdamW& opt, bool print) {
  const OptimizerMemory mem = opt.memory();
  double bytes[2] = {static_cast<double>(mem.state_bytes()), 0.0};
  for (const auto& g : mem.groups) bytes[1] += 8.0 * static_cast<double>(g.num_elements);
  world.allreduce(bytes, 2, ReduceOp::kMax);
  if (!print) return;
  const bool sharded = opt.sharding() == OptimizerSharding::kDp;
  std::printf("%-28s AdamW, moments %s over dp %d, edp %d: %.2f MiB per rank (unsharded "
              "%.2f MiB)\n",
              "optimizer", sharded ? "sharded" : "replicated", lay.dp, lay.edp,
              bytes[0] / (1 << 20), bytes[1] / (1 << 20));
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, bool verbose)
    : cfg_(resolved(cfg)),
      verbose_(verbose),
      topo_(create_topology(cfg_)),
      world_(topo_->host_comm(Group::kWorld)),
      root_(topo_->world_rank() == 0),
      accum_(cfg_.loop.grad_accum),
      micro_(cfg_.loop.micro_batch),
      schedules_(choose_schedules(cfg_, *topo_, {}, "", verbose_, cost_profile_)),
      data_(open_training_data(cfg_, world_, verbose_ && root_)),
      source_(data_.corpus, objective(cfg_), cfg_.model.seq_len, cfg_.model.seed),
      pipe_(pipeline_options(cfg_, *topo_)),
      model_(model::make_model(*topo_, cfg_.model, schedules_, micro_,
                               parse_precision(cfg_.parallel.precision), pipe_)),
      params_(model_->params()),
      all_params_(model_->all_param_specs()),
      pipeline_(make_pipeline(cfg_, *topo_, *model_)),
      opt_(make_adamw(*topo_, params_, parse_optimizer_sharding(cfg_.optim.sharding))),
      optim_(optim_config(cfg_)),
      model_json_(model_config_json(cfg_.model)),
      global_batch_(micro_ * accum_ * topo_->layout().dp),
      tokens_per_step_(global_batch_ * cfg_.model.seq_len) {
  const Layout& lay = topo_->layout();
  // Every MoE layer's, also those of other pipeline stages (model_->schedules() has this
  // stage's).
  result_.schedules = schedule_names(schedules_, cfg_, lay);
  const GemmRate gemm = gemm_rate_for_mfu(cfg_.loop.profile,
                                          parse_precision(cfg_.parallel.precision),
                                          topo_->device(), world_);
  result_.gemm_gflops = gemm.gflops;
  if (!cfg_.loop.resume.empty()) resume();
  source_.check_position(data_position_, sequences_ahead(cfg_.loop.steps - step_, global_batch_),
                         cfg_.loop.resume.empty() ? std::string("this run")
                                                  : fmt::format("checkpoint {}", cfg_.loop.resume));
  if (root_ && !cfg_.loop.metrics.empty()) {
    metrics_ = std::fopen(cfg_.loop.metrics.c_str(), cfg_.loop.resume.empty() ? "w" : "a");
    PARM_CHECK(metrics_ != nullptr, "cannot open metrics file {}", cfg_.loop.metrics);
  }
  if (root_ && verbose_)
    print_run_header(cfg_, lay, result_.schedules, data_.corpus,
                     data_.tokenizer->describe(), global_batch_, gemm);
  print_optimizer_state(world_, lay, opt_, root_ && verbose_);
  if (lay.pp > 1) print_stages(*topo_, *model_, params_, opt_.memory(), static_cast<int>(accum_),
                              root_ && verbose_);

  if (cfg_.loop.phase_times) model_->time_phases(&phases_);
  schedules_line_ = fmt::format("{}", fmt::join(result_.schedules, ","));
  fields_ = {cfg_.loop.steps, cfg_.model.router_z_loss > 0, lay.pp > 1, cfg_.loop.phase_times};
  // --schedule / --fuse auto price a balanced router first; the first report step's
  // measured routing prices them again, once.
  replan_pending_ = plans_schedules(cfg_);
  run_t0_us_ = now_us();
  // Fixed by the configuration and the layout, so reduced once here rather than every step
  // (a re-plan keeps both).
  total_flops_ = model_->flops_per_step(micro_ * cfg_.model.seq_len) * static_cast<double>(accum_);
  world_.allreduce(&total_flops_, 1);
}

Trainer::~Trainer() {
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void Trainer::resume() {
  const CheckpointState st =
      load_checkpoint(*topo_, cfg_.loop.resume, all_params_, params_, opt_, model_json_,
                      data_.tokenizer->identity());
  step_ = st.step;
  data_position_ = st.data_position;
  set_router_bias(*model_, cfg_.model, st.router_bias, cfg_.loop.resume);
  if (root_ && verbose_)
    std::printf("resumed from %s at step %lld (%lld sequences consumed)\n",
                cfg_.loop.resume.c_str(), static_cast<long long>(step_),
                static_cast<long long>(data_position_));
}

TrainResult Trainer::run() {
  while (step_ < cfg_.loop.steps) {
    const StepMetrics m = step();
    const bool last = step_ == cfg_.loop.steps;
    if (last) result_.final_val_loss = m.val_loss;
    report(m, report_step(step_));
    if (replan_pending_ && report_step(step_) && !last) replan();
    if (!cfg_.loop.save_dir.empty() &&
        ((cfg_.loop.save_every > 0 && step_ % cfg_.loop.save_every == 0) || last))
      save();
  }
  finish();
  return std::move(result_);
}

bool Trainer::report_step(int64_t steps_done) const {
  return steps_done % cfg_.loop.log_every == 0 || steps_done == cfg_.loop.steps;
}

void Trainer::report(const StepMetrics& m, bool report_step) {
  if (!root_) return;
  result_.history.push_back(m);
  if (verbose_ && (report_step || m.val_loss >= 0)) {
    std::fputs(progress_text(m, fields_, schedules_line_).c_str(), stdout);
    std::fflush(stdout);
  }
  if (metrics_ != nullptr) {
    const std::string text = metrics_json(m, fields_).dump() + "\n";
    std::fwrite(text.data(), 1, text.size(), metrics_);  // one write per line
    std::fflush(metrics_);
  }
}

void Trainer::replan() {
  replan_pending_ = false;
  const Layout& lay = topo_->layout();
  const auto lambdas = measured_load_max_over_mean(world_, *model_, cfg_.model, lay, layer_loads_);
  const std::string prefix = fmt::format("re-plan after step {}: ", step_);
  auto next = choose_schedules(cfg_, *topo_, lambdas, prefix, verbose_, cost_profile_);
  const bool same = std::equal(next.begin(), next.end(), schedules_.begin(),
                               [](const auto& x, const auto& y) {
                                 return x.kind == y.kind && x.fuse == y.fuse;
                               });
  if (!same) {
    Rebuilt r = rebuild_model(*topo_, cfg_.model, next, micro_,
                              parse_precision(cfg_.parallel.precision), pipe_, *model_, params_,
                              opt_);
    pipeline_.reset();
    model_ = std::move(r.model);
    params_ = std::move(r.params);
    opt_ = std::move(r.opt);
    pipeline_ = make_pipeline(cfg_, *topo_, *model_);
    if (cfg_.loop.phase_times) model_->time_phases(&phases_);
  }
  const std::string before = schedules_line_;
  schedules_ = std::move(next);
  result_.schedules = schedule_names(schedules_, cfg_, lay);
  schedules_line_ = fmt::format("{}", fmt::join(result_.schedules, ","));
  if (root_ && verbose_) {
    std::printf("re-plan after step %lld: MoE schedules %s -> %s (%s)\n",
                static_cast<long long>(step_), before.c_str(), schedules_line_.c_str(),
                same ? "kept" : "switched");
    std::fflush(stdout);
  }
}

void Trainer::save() {
  const nlohmann::json bias = cfg_.model.router_bias_update > 0
                                  ? gather_router_bias(world_, *model_, cfg_.model)
                                  : nlohmann::json();
  const std::string where = save_checkpoint(*topo_, cfg_.loop.save_dir, all_params_, params_,
                                            opt_,
                                            {step_, data_position_, model_json_, bias,
                                             data_.tokenizer->identity(),
                                             data_.tokenizer->model_bytes()});
  if (root_ && verbose_) std::printf("saved %s\n", where.c_str());
}

void Trainer::finish() {
  if (metrics_ != nullptr) std::fclose(metrics_);
  metrics_ = nullptr;
  result_.rank_memory = all_memory_peaks(world_, topo_->device());
  if (root_ && verbose_) print_summary(cfg_.name, result_, (now_us() - run_t0_us_) / 1e6);
  if (root_ && !result_.history.empty()) {
    std::string chart = cfg_.loop.chart;
    if (chart.empty() && !cfg_.loop.metrics.empty()) chart = cfg_.loop.metrics + ".svg";
    if (!chart.empty()) {
      write_file_atomic(chart, loss_chart_svg(result_.history, cfg_.name));
      if (verbose_) std::printf("%-28s %s\n", "loss chart", chart.c_str());
    }
  }
}

TrainResult run_training(const TrainConfig& config, bool verbose) {
  return Trainer(config, verbose).run();
}

}  // namespace parm::train
