// `parm train`: train a GPT-2- or BERT-style MoE model from a config, with command-line
// overrides.
#include <filesystem>

#include "cli_common.h"
#include "router_flags.h"
#include "parm/error.h"
#include "model/memory_plan.h"
#include "train/memory_check.h"
#include "train/trainer.h"

namespace parm::cli {

extern const char* const kDefaultTrainConfig;

namespace {

struct TrainFlags {
  std::string config;
  int64_t steps = -1, micro_batch = -1, grad_accum = -1, eval_every = -1, save_every = -1,
          log_every = -1;
  int mp = -1, ep = -1, esp = -1, pp = -1, chunks = -1, ranks_per_node = -1;
  double lr = -1, timeout_s = -1;
  float router_z_loss = 0.0f, router_bias_update = 0.0f;
  CLI::Option* router_z_loss_opt = nullptr;
  CLI::Option* router_bias_update_opt = nullptr;
  RouterFlags router;
  std::string schedule, fuse, save_dir, metrics, chart, profile, corpus, capacity_factor;
  std::string tokenizer, data, data_cache;
  std::string aux_loss, expert_mlp, shared_gate, shared_overlap, pad_to_capacity;
  int shared_experts = -1;
  int64_t shared_hidden = -1;
  std::string device, precision, comm, order, pp_split, pp_overlap;
  std::string optimizer_sharding;
  std::string resume;
  std::string recompute, memory_limit;
  bool dry_run_memory = false;
  int dry_run_world = 0;
  CLI::Option* resume_opt = nullptr;
  bool phase_times = false;
};

train::TrainConfig resolve_config(const std::string& name) {
  if (name.empty())
    return train::parse_train_config(nlohmann::json::parse(kDefaultTrainConfig),
                                     "the built-in gpt2-moe-tiny config");
  namespace fs = std::filesystem;
  // A path, or a name under configs/ (here or in the source tree this binary was built from).
  for (const fs::path& p : {fs::path(name), fs::path("configs") / (name + ".json"),
                            fs::path(PARM_SOURCE_DIR) / "configs" / (name + ".json")})
    if (fs::is_regular_file(p)) return train::load_train_config(p.string());
  throw InvalidConfig(fmt::format(
      "config '{}' not found: give a JSON file path or a name in configs/ (gpt2-moe-tiny, "
      "bert-moe-tiny, gpt2-small-moe, bert-base-moe, mixtral-moe-tiny, deepseek-moe-tiny, "
      "gpt2-moe-tiny-bpe)",
      name));
}

int run_train(TrainFlags& f) {
  train::TrainConfig c = resolve_config(f.config);
  auto& l = c.loop;
  auto& p = c.parallel;
  if (f.steps >= 0) l.steps = f.steps;
  if (f.micro_batch >= 0) l.micro_batch = f.micro_batch;
  if (f.grad_accum >= 0) l.grad_accum = f.grad_accum;
  if (f.eval_every >= 0) l.eval_every = f.eval_every;
  if (f.log_every >= 0) l.log_every = f.log_every;
  if (f.save_every >= 0) l.save_every = f.save_every;
  if (f.mp > 0) p.mp = f.mp;
  if (f.ep > 0) p.ep = f.ep;
  if (f.esp > 0) p.esp = f.esp;
  if (f.pp > 0) p.pp = f.pp;
  if (!f.order.empty()) p.order = f.order;
  if (!f.pp_split.empty()) p.pp_split = f.pp_split;
  if (!f.pp_overlap.empty()) p.pp_overlap = f.pp_overlap;
  if (f.chunks > 0) p.chunks = f.chunks;
  if (f.ranks_per_node >= 0) p.ranks_per_node = f.ranks_per_node;
  if (f.timeout_s > 0) p.timeout_s = f.timeout_s;
  if (f.lr > 0) c.optim.lr = f.lr;
  if (!f.optimizer_sharding.empty()) c.optim.sharding = f.optimizer_sharding;
  if (!f.schedule.empty()) p.schedule = f.schedule;
  if (!f.fuse.empty()) p.fuse = f.fuse;
  if (!f.shared_overlap.empty())
    p.shared_overlap =
        parse_on_off(f.shared_overlap, "--shared-overlap (parallel.shared_overlap)");
  if (!f.pad_to_capacity.empty())
    p.pad_to_capacity =
        parse_on_off(f.pad_to_capacity, "--pad-to-capacity (parallel.pad_to_capacity)");
  if (!f.device.empty()) p.device = f.device;
  if (!f.precision.empty()) p.precision = f.precision;
  if (!f.comm.empty()) p.comm = f.comm;
  if (!f.save_dir.empty()) l.save_dir = f.save_dir;
  if (!f.metrics.empty()) l.metrics = f.metrics;
  if (!f.chart.empty()) l.chart = f.chart;
  if (f.phase_times) l.phase_times = true;
  if (!f.recompute.empty()) l.recompute = f.recompute;
  if (!f.memory_limit.empty())
    l.memory_limit = model::parse_bytes(f.memory_limit, "--memory-limit");
  if (!f.profile.empty()) l.profile = f.profile;
  if (!f.corpus.empty()) c.data.corpus = f.corpus;
  if (!f.tokenizer.empty()) {
    c.data.tokenizer = f.tokenizer;
    c.data.tokenizer_vocab = 0;
  }
  if (!f.data.empty()) c.data.prepared = f.data;
  if (!f.data_cache.empty()) c.data.cache = f.data_cache;
  if (!f.capacity_factor.empty()) c.model.capacity_factor = f.capacity_factor;
  if (!f.aux_loss.empty()) c.model.aux_scope = parse_aux_scope(f.aux_loss);
  if (!f.expert_mlp.empty()) c.model.expert_mlp = parse_expert_mlp(f.expert_mlp);
  if (f.shared_experts >= 0) c.model.shared_experts = f.shared_experts;
  if (f.shared_hidden >= 0) c.model.shared_hidden = f.shared_hidden;
  if (!f.shared_gate.empty())
    c.model.shared_gate = parse_on_off(f.shared_gate, "--shared-gate (model.shared_gate)");
  if (f.router_z_loss_opt->count() > 0) c.model.router_z_loss = f.router_z_loss;
  if (f.router_bias_update_opt->count() > 0) c.model.router_bias_update = f.router_bias_update;
  f.router.apply(c.model.router);
  if (f.resume_opt->count() > 0) {
    l.resume = f.resume.empty() ? l.save_dir : f.resume;
    PARM_CONFIG_CHECK(!l.resume.empty(),
                      "--resume without a folder needs --save-dir (or train.save_dir) to resume "
                      "from its latest checkpoint");
  }
  PARM_CONFIG_CHECK(f.dry_run_world == 0 || f.dry_run_memory,
                    "--world-size {} is for --dry-run-memory only (a run's world size is its "
                    "ranks')", f.dry_run_world);
  if (f.dry_run_memory) {
    // The prediction alone: nothing is built, no rank talks to another.
    train::validate(c);
    const int world = f.dry_run_world > 0 ? f.dry_run_world : world_size();
    const Layout lay = make_layout(world, p.mp, p.ep, p.esp, p.pp, p.order);
    const auto plans = train::predict_run_memory(c, lay);
    if (world_rank() == 0) std::fputs(train::memory_plan_text(c, lay, plans).c_str(), stdout);
    train::check_memory_limit(c, lay);
    return 0;
  }
  train::run_training(c, true);
  return 0;
}

}  // namespace

Command add_train(CLI::App& root) {
  auto* app = root.add_subcommand("train", "train a GPT-2- or BERT-style MoE model");
  auto f = std::make_shared<TrainFlags>();
  app->add_option("--config", f->config,
                  "config file or name in configs/ (default: the built-in gpt2-moe-tiny)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--steps", f->steps, "optimizer steps");
  app->add_option("--micro-batch", f->micro_batch, "sequences per micro-batch per DP replica");
  app->add_option("--grad-accum", f->grad_accum, "micro-batches per step per DP replica");
  app->add_option("--eval-every", f->eval_every, "validation every N steps (0: at the end)");
  app->add_option("--log-every", f->log_every, "progress line every N steps");
  app->add_option("--lr", f->lr, "peak learning rate");
  app->add_option("--optimizer-sharding", f->optimizer_sharding,
                  "none: every rank keeps the whole AdamW state; dp: each keeps 1/dp of the "
                  "dense parameters' and 1/edp of its experts' (gradients reduce-scattered, "
                  "parameters all-gathered; docs/optimizer.md); default none");
  app->add_option("--mp", f->mp, "model (tensor) parallel size");
  app->add_option("--ep", f->ep, "expert parallel size");
  app->add_option("--esp", f->esp, "expert sharding size");
  app->add_option("--pp", f->pp, "pipeline parallel size (stages)")->check(CLI::PositiveNumber);
  app->add_option("--pp-split", f->pp_split,
                  "blocks per pipeline stage, first to last, e.g. 3,3,3,3 (default: balanced)");
  app->add_option("--pp-overlap", f->pp_overlap,
                  "on: a stage runs two micro-batches' passes together, one computing while "
                  "the other's MoE AllToAll is in flight (docs/pipeline.md); default off");
  app->add_option("--order", f->order,
                  "nesting of the groups, innermost first: mp, esp, ep, dp, pp joined by '-' "
                  "(default mp-esp-ep-dp-pp; docs/layout.md)");
  app->add_option("--schedule", f->schedule, "MoE schedule: baseline, s1, s2 or auto");
  app->add_option("--fuse", f->fuse, "fused collectives: on, off or auto");
  app->add_option("--chunks", f->chunks, "pipeline depth of the fused collectives");
  app->add_option("--shared-overlap", f->shared_overlap,
                  "on: S1 and S2 compute the shared experts while the dispatch AllToAll is in "
                  "flight (where it is not fused; needs --shared-experts; bit-identical); off "
                  "(default): one after the other (parallel.shared_overlap)");
  app->add_option("--pad-to-capacity", f->pad_to_capacity,
                  "with a capacity factor: on (default): the MoE exchanges move whole capacity "
                  "buffers (GShard, DeepSpeed-MoE); off: the kept rows only, as dropless "
                  "routing's do (parallel.pad_to_capacity)");
  app->add_option("--device", f->device,
                  "where the model computes: cpu or cuda (every layer, the optimizer and the "
                  "gradient reductions on the device; checkpoints are copied to the host)");
  app->add_option("--precision", f->precision,
                  "fp32, or bf16: bf16 operands for every product (experts and dense layers), "
                  "fp32 accumulation, master weights, optimizer state, reductions and losses");
  app->add_option("--comm", f->comm,
                  "what moves the MoE layers' device buffers: auto, nccl, or mpi (staged "
                  "through host memory)");
  app->add_option("--capacity-factor", f->capacity_factor, "MoE capacity factor (a decimal), or none: dropless routing");
  app->add_option("--aux-loss", f->aux_loss,
                  "what each l_aux is over: micro-batch (each gate call's tokens; default), "
                  "sequence (each sequence's tokens, the mean over the sequences) or global "
                  "(every token of the micro-step on all data-parallel replicas)");
  f->router.add_to(app);
  app->add_option("--expert-mlp", f->expert_mlp,
                  "the experts' FFN: gelu (with biases) or swiglu ((silu(x W1) * x W3) W2, no "
                  "biases); overrides model.expert_mlp");
  app->add_option("--shared-experts", f->shared_experts,
                  "shared experts every token passes through (model.shared_experts; 0: none)");
  app->add_option("--shared-hidden", f->shared_hidden,
                  "their hidden width H_s (model.shared_hidden; default: the experts' hidden "
                  "width, model.expert_hidden)");
  app->add_option("--shared-gate", f->shared_gate,
                  "on: their output times sigmoid(x w_sg) (model.shared_gate); off");
  f->router_z_loss_opt = app->add_option(
      "--router-z-loss", f->router_z_loss,
      "ST-MoE router z-loss coefficient (mean over tokens of logsumexp(logits)^2; 0: off)");
  f->router_bias_update_opt = app->add_option(
      "--router-bias-update", f->router_bias_update,
      "DeepSeek-V3 auxiliary-loss-free balancing: per-expert router bias for the top-k choice, "
      "updated after each step by RATE x sign(mean load - load); 0: off");
  app->add_option("--corpus", f->corpus, "kjv or file:PATH");
  app->add_option("--tokenizer", f->tokenizer,
                  "byte or a SentencePiece .model file (data.tokenizer); with --data it must be "
                  "the dataset's, without it the corpus is prepared with it into the cache");
  app->add_option("--data", f->data,
                  "a prepared dataset folder (parm prepare-data; data.prepared)");
  app->add_option("--data-cache", f->data_cache,
                  "where a tokenizer and dataset the config names but does not give are made "
                  "once (data.cache; default build/data-cache)");
  app->add_option("--ranks-per-node", f->ranks_per_node, "emulate nodes of this many ranks");
  app->add_option("--timeout", f->timeout_s, "watchdog seconds per communication");
  app->add_option("--save-dir", f->save_dir, "checkpoint folder");
  app->add_option("--save-every", f->save_every, "checkpoint every N steps (0: at the end)");
  f->resume_opt = app->add_option("--resume", f->resume,
                                  "resume from this checkpoint (default: the latest in --save-dir)")
                      ->expected(0, 1);
  app->add_option("--metrics", f->metrics, "write one JSON line per step to this file");
  app->add_option("--chart", f->chart, "loss-curve SVG (default: <metrics>.svg)");
  app->add_flag("--phase-times", f->phase_times,
                "time the step's phases (attention, dense, moe, embed+head, grad-reduce, "
                "grad-norm, optimizer, param-gather with --optimizer-sharding dp; each waits "
                "for the device): a 'phases' line and metrics key phase_ms");
  app->add_option("--profile", f->profile, "cost-model profile for --schedule auto");
  app->add_option("--memory-limit", f->memory_limit,
                  "refuse the run before any work when a rank's predicted memory exceeds this "
                  "(train.memory_limit): bytes, or with a suffix KiB, MiB, GiB, TiB (1024^n) or "
                  "KB, MB, GB, TB (1000^n), e.g. 8GiB");
  app->add_flag("--dry-run-memory", f->dry_run_memory,
                "print the predicted per-rank memory of the config and layout and exit, "
                "building nothing (with --memory-limit: exit 2 when it does not fit)");
  app->add_option("--world-size", f->dry_run_world,
                  "with --dry-run-memory: the world size of the layout to predict (default: "
                  "the ranks running)")
      ->check(CLI::PositiveNumber);
  app->add_option("--recompute", f->recompute,
                  "what the forward drops and the backward recomputes (train.recompute): none, "
                  "moe-act (the experts' activations), moe (the MoE layers' internals but what "
                  "their collectives produced) or block (whole blocks); docs/memory.md");
  return {app, [f] { return run_train(*f); }};
}

}  // namespace parm::cli
