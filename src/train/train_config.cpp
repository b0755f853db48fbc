#include "train/train_config.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/ranges.h>

#include "shape/shape.h"
#include "model/pp_split.h"
#include "moe/backend.h"
#include "parm/device.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/topology.h"

namespace parm::train {
namespace {

// Reads the keys of one section into fields, refusing unknown keys and wrong types.
class Section {
 public:
  Section(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    PARM_CONFIG_CHECK(j_.is_object(), "{} must be a JSON object", where_);
  }
  template <typename T>
  void get(const char* key, T& field) {
    known_.insert(key);
    if (!j_.contains(key)) return;
    const auto& v = j_.at(key);
    if (!fits<T>(v))
      throw InvalidConfig(fmt::format("{}.{} has the wrong type or is out of range: {} "
                                      "(expected {})",
                                      where_, key, shown(v), type_name<T>()));
    field = v.get<T>();
  }
  void finish() const {
    for (const auto& [k, v] : j_.items())
      if (!known_.count(k)) {
        std::string valid;
        for (const auto& n : known_) valid += (valid.empty() ? "" : ", ") + n;
        throw InvalidConfig(fmt::format("unknown key {}.{}; valid keys: {}", where_, k, valid));
      }
  }

 private:
  // True when v converts to T exactly as written: a string, a finite number within T's
  // range, or a whole number within T's range (2.5 is not an integer, 1e300 not a float).
  template <typename T>
  static bool fits(const nlohmann::json& v) {
    if constexpr (std::is_same_v<T, nlohmann::json>) {
      return true;
    } else if constexpr (std::is_same_v<T, std::string>) {
      return v.is_string();
    } else if constexpr (std::is_same_v<T, bool>) {
      return v.is_boolean();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) return false;
      const double d = v.get<double>();
      return std::isfinite(d) && std::fabs(d) <= double{std::numeric_limits<T>::max()};
    } else {
      static_assert(std::is_integral_v<T>);
      if (!v.is_number_integer()) return false;
      const auto max = static_cast<uint64_t>(std::numeric_limits<T>::max());
      if (v.is_number_unsigned()) return v.get<uint64_t>() <= max;
      const int64_t i = v.get<int64_t>();
      return i < 0 ? i >= static_cast<int64_t>(std::numeric_limits<T>::min())
                   : static_cast<uint64_t>(i) <= max;
    }
  }
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    else if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_floating_point_v<T>) return "a finite number";
    else if constexpr (std::is_integral_v<T>) return "a whole number in range";
    else return "a JSON value";
  }
  static std::string shown(const nlohmann::json& v) {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> known_;
};

}  // namespace

nlohmann::json model_config_json(const model::ModelConfig& m) {
  nlohmann::json j = {{"arch", m.arch == model::Arch::kGpt2 ? "gpt2" : "bert"},
          {"vocab", m.vocab},
          {"seq_len", m.seq_len},
          {"model_dim", m.model_dim},
          {"num_heads", m.num_heads},
          {"num_layers", m.num_layers},
          {"ffn_hidden", m.ffn_hidden},
          {"moe_every", m.moe_every},
          {"experts", m.experts},
          {"expert_hidden", m.expert_hidden},
          {"topk", m.topk},
          {"capacity_factor", m.capacity_factor == "none" ? nlohmann::json(nullptr)
                                                          : nlohmann::json(m.capacity_factor)},
          {"aux_loss_coeff", m.aux_loss_coeff},
          {"init_std", m.init_std},
          {"seed", m.seed}};
  // The router's keys where they differ from docs/spec.md §2's (so the checkpoints of
  // earlier versions, which have none, still match a default router): the keys of
  // model_keys_omitted_at_default.
  const RouterSpec d;
  if (m.router.score != d.score) j["router_score"] = router_score_name(m.router.score);
  if (m.router.topk_norm != d.topk_norm) j["router_topk_norm"] = m.router.topk_norm;
  if (m.router.scale != d.scale) j["router_scale"] = m.router.scale;
  if (m.router.groups != d.groups) j["router_groups"] = m.router.groups;
  if (m.router.group_topk != d.group_topk) j["router_group_topk"] = m.router.group_topk;
  // Likewise the experts' kind, where it is not gelu (docs/spec.md §8).
  if (m.expert_mlp != ExpertMlp::kGelu) j["expert_mlp"] = expert_mlp_name(m.expert_mlp);
  if (m.shared_experts != 0) {
    j["shared_experts"] = m.shared_experts;
    j["shared_hidden"] = model::shared_width(m);
    j["shared_gate"] = m.shared_gate;
  }
  return j;
}

const std::vector<std::string>& model_keys_omitted_at_default() {
  static const std::vector<std::string> keys = {"router_score", "router_topk_norm",
                                                "router_scale", "router_groups",
                                                "router_group_topk", "expert_mlp",
                                                "shared_experts", "shared_hidden",
                                                "shared_gate"};
  return keys;
}

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& origin) {
  TrainConfig c;
  Section top(j, origin);
  top.get("name", c.name);
  nlohmann::json empty = nlohmann::json::object();
  auto section = [&](const char* key) -> const nlohmann::json& {
    return j.contains(key) ? j.at(key) : empty;
  };
  for (const char* key : {"model", "optim", "data", "train", "parallel"}) {
    nlohmann::json dummy;
    top.get(key, dummy);
  }
  top.finish();

  Section m(section("model"), origin + ": model");
  std::string arch = "gpt2";
  m.get("arch", arch);
  PARM_CONFIG_CHECK(arch == "gpt2" || arch == "bert",
                    "{}: model.arch '{}' is not valid; use \"gpt2\" or \"bert\"", origin, arch);
  c.model.arch = arch == "gpt2" ? model::Arch::kGpt2 : model::Arch::kBert;
  c.model.vocab = c.model.arch == model::Arch::kGpt2 ? 256 : 257;
  m.get("vocab", c.model.vocab);
  m.get("seq_len", c.model.seq_len);
  m.get("model_dim", c.model.model_dim);
  m.get("num_heads", c.model.num_heads);
  m.get("num_layers", c.model.num_layers);
  m.get("ffn_hidden", c.model.ffn_hidden);
  m.get("moe_every", c.model.moe_every);
  m.get("experts", c.model.experts);
  m.get("expert_hidden", c.model.expert_hidden);
  m.get("topk", c.model.topk);
  {
    nlohmann::json f = c.model.capacity_factor;  // a decimal string, or null: dropless
    m.get("capacity_factor", f);
    PARM_CONFIG_CHECK(f.is_string() || f.is_null(),
                      "{}: model.capacity_factor must be a decimal string such as \"1.25\", or "
                      "null for dropless routing, got {}",
                      origin, f.dump());
    c.model.capacity_factor = f.is_null() ? "none" : f.get<std::string>();
  }
  m.get("aux_loss_coeff", c.model.aux_loss_coeff);
  {
    std::string scope = aux_scope_name(c.model.aux_scope);
    m.get("aux_loss", scope);
    try {
      c.model.aux_scope = parse_aux_scope(scope);
    } catch (const InvalidConfig& e) {
      throw InvalidConfig(fmt::format("{}: {}", origin, e.what()));
    }
  }
  {
    std::string score = router_score_name(c.model.router.score);
    m.get("router_score", score);
    try {
      c.model.router.score = parse_router_score(score);
    } catch (const InvalidConfig& e) {
      throw InvalidConfig(fmt::format("{}: {}", origin, e.what()));
    }
  }
  {
    std::string mlp = expert_mlp_name(c.model.expert_mlp);
    m.get("expert_mlp", mlp);
    try {
      c.model.expert_mlp = parse_expert_mlp(mlp);
    } catch (const InvalidConfig& e) {
      throw InvalidConfig(fmt::format("{}: {}", origin, e.what()));
    }
  }
  m.get("shared_experts", c.model.shared_experts);
  m.get("shared_hidden", c.model.shared_hidden);
  m.get("shared_gate", c.model.shared_gate);
  m.get("router_topk_norm", c.model.router.topk_norm);
  m.get("router_scale", c.model.router.scale);
  m.get("router_groups", c.model.router.groups);
  m.get("router_group_topk", c.model.router.group_topk);
  m.get("router_z_loss", c.model.router_z_loss);
  m.get("router_bias_update", c.model.router_bias_update);
  m.get("init_std", c.model.init_std);
  m.get("seed", c.model.seed);
  m.finish();

  Section o(section("optim"), origin + ": optim");
  o.get("lr", c.optim.lr);
  o.get("min_lr", c.optim.min_lr);
  o.get("warmup_steps", c.optim.warmup_steps);
  o.get("beta1", c.optim.beta1);
  o.get("beta2", c.optim.beta2);
  o.get("eps", c.optim.eps);
  o.get("weight_decay", c.optim.weight_decay);
  o.get("grad_clip", c.optim.grad_clip);
  o.get("sharding", c.optim.sharding);
  o.finish();

  Section d(section("data"), origin + ": data");
  d.get("corpus", c.data.corpus);
  d.get("val_fraction", c.data.val_fraction);
  {
    nlohmann::json t;  // a name or path, or {"kind": .., "vocab": ..}
    d.get("tokenizer", t);
    if (t.is_string()) {
      c.data.tokenizer = t.get<std::string>();
    } else if (t.is_object()) {
      Section k(t, origin + ": data.tokenizer");
      k.get("kind", c.data.tokenizer);
      k.get("vocab", c.data.tokenizer_vocab);
      k.finish();
      PARM_CONFIG_CHECK((c.data.tokenizer == "bpe" || c.data.tokenizer == "unigram") &&
                            c.data.tokenizer_vocab >= 258,
                        "{}: data.tokenizer {} must name a kind (\"bpe\" or \"unigram\") and a "
                        "vocabulary of at least 258 (\"vocab\"), e.g. {{\"kind\": \"bpe\", "
                        "\"vocab\": 8192}}",
                        origin, t.dump());
    } else {
      PARM_CONFIG_CHECK(t.is_null(),
                        "{}: data.tokenizer {} must be \"byte\", a .model file or {{\"kind\": "
                        "\"bpe\", \"vocab\": 8192}}",
                        origin, t.dump());
    }
  }
  d.get("prepared", c.data.prepared);
  d.get("cache", c.data.cache);
  d.finish();
  c.data.vocab_in_config = section("model").contains("vocab");

  Section t(section("train"), origin + ": train");
  t.get("steps", c.loop.steps);
  t.get("micro_batch", c.loop.micro_batch);
  t.get("grad_accum", c.loop.grad_accum);
  t.get("eval_every", c.loop.eval_every);
  t.get("eval_batches", c.loop.eval_batches);
  t.get("log_every", c.loop.log_every);
  t.get("save_every", c.loop.save_every);
  t.get("save_dir", c.loop.save_dir);
  t.get("metrics", c.loop.metrics);
  t.get("recompute", c.loop.recompute);
  t.get("memory_limit", c.loop.memory_limit);
  t.finish();

  Section p(section("parallel"), origin + ": parallel");
  p.get("mp", c.parallel.mp);
  p.get("ep", c.parallel.ep);
  p.get("esp", c.parallel.esp);
  p.get("pp", c.parallel.pp);
  p.get("order", c.parallel.order);
  // pp_split: "3,3,3,3" as on the command line, or [3, 3, 3, 3].
  nlohmann::json split;
  p.get("pp_split", split);
  if (split.is_array()) {
    std::vector<std::string> items;
    for (const auto& v : split) {
      PARM_CONFIG_CHECK(v.is_number_unsigned(),
                        "{}: parallel.pp_split {} must hold whole block counts, e.g. [3, 3]",
                        origin, split.dump());
      items.push_back(std::to_string(v.get<uint64_t>()));
    }
    c.parallel.pp_split = fmt::format("{}", fmt::join(items, ","));
  } else if (split.is_string()) {
    c.parallel.pp_split = split.get<std::string>();
  } else {
    PARM_CONFIG_CHECK(split.is_null(),
                      "{}: parallel.pp_split {} must be a string \"3,3\" or an array [3, 3] "
                      "of blocks per stage",
                      origin, split.dump());
  }
  p.get("pp_overlap", c.parallel.pp_overlap);
  p.get("schedule", c.parallel.schedule);
  p.get("fuse", c.parallel.fuse);
  p.get("shared_overlap", c.parallel.shared_overlap);
  p.get("pad_to_capacity", c.parallel.pad_to_capacity);
  p.get("chunks", c.parallel.chunks);
  p.get("device", c.parallel.device);
  p.get("precision", c.parallel.precision);
  p.get("comm", c.parallel.comm);
  p.finish();
  return c;
}

TrainConfig load_train_config(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("config {}: {}", path, e.what()));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidConfig(fmt::format("config {} is not valid JSON: {}", path, e.what()));
  }
  return parse_train_config(j, path);
}

void validate(const TrainConfig& c) {
  const auto& m = c.model;
  auto positive = [](const char* key, int64_t v) {
    PARM_CONFIG_CHECK(v >= 1, "{} is {}; it must be at least 1", key, v);
  };
  positive("model.seq_len", m.seq_len);
  positive("model.model_dim", m.model_dim);
  positive("model.num_heads", m.num_heads);
  positive("model.num_layers", m.num_layers);
  positive("model.ffn_hidden", m.ffn_hidden);
  positive("model.moe_every", m.moe_every);
  positive("model.experts", m.experts);
  positive("model.expert_hidden", m.expert_hidden);
  PARM_CONFIG_CHECK(m.topk >= 1 && m.topk <= m.experts,
                    "model.topk {} must be between 1 and model.experts {}", m.topk, m.experts);
  PARM_CONFIG_CHECK(m.model_dim % m.num_heads == 0,
                    "model.model_dim {} is not divisible by model.num_heads {}", m.model_dim,
                    m.num_heads);
  // (A tokenizer's vocabulary sets model.vocab: train/data_setup.h.)
  const bool bytes = (c.data.tokenizer.empty() || c.data.tokenizer == "byte") &&
                     c.data.prepared.empty();
  const int64_t min_vocab = m.arch == model::Arch::kGpt2 ? 256 : 257;
  PARM_CONFIG_CHECK(!bytes || m.vocab >= min_vocab,
                    "model.vocab {} is too small for the byte tokenizer: at least {}", m.vocab,
                    min_vocab);
  CapacityFactor::parse(m.capacity_factor);
  positive("train.steps", c.loop.steps);
  positive("train.micro_batch", c.loop.micro_batch);
  positive("train.grad_accum", c.loop.grad_accum);
  positive("train.log_every", c.loop.log_every);
  PARM_CONFIG_CHECK(c.loop.eval_every >= 0 && c.loop.save_every >= 0 && c.loop.eval_batches >= 1,
                    "train.eval_every and train.save_every must be >= 0 and train.eval_batches "
                    ">= 1");
  PARM_CONFIG_CHECK(c.optim.lr > 0 && c.optim.min_lr >= 0 && c.optim.min_lr <= c.optim.lr,
                    "optim.lr {} must be positive and optim.min_lr {} in [0, lr]", c.optim.lr,
                    c.optim.min_lr);
  PARM_CONFIG_CHECK(c.optim.beta1 >= 0 && c.optim.beta1 < 1 && c.optim.beta2 >= 0 &&
                        c.optim.beta2 < 1,
                    "optim.beta1 {} and optim.beta2 {} must be in [0, 1)", c.optim.beta1,
                    c.optim.beta2);
  parse_optimizer_sharding(c.optim.sharding, "optim.sharding (--optimizer-sharding)");
  const auto& p = c.parallel;
  PARM_CONFIG_CHECK(p.schedule == "baseline" || p.schedule == "s1" || p.schedule == "s2" ||
                        p.schedule == "auto",
                    "parallel.schedule '{}' is not valid; use baseline, s1, s2 or auto",
                    p.schedule);
  PARM_CONFIG_CHECK(p.fuse == "on" || p.fuse == "off" || p.fuse == "auto",
                    "parallel.fuse '{}' is not valid; use on, off or auto", p.fuse);
  PARM_CONFIG_CHECK(p.chunks >= 1, "parallel.chunks {} must be at least 1", p.chunks);
  PARM_CONFIG_CHECK(p.pp >= 1, "parallel.pp {} must be at least 1", p.pp);
  PARM_CONFIG_CHECK(p.pp_overlap == "on" || p.pp_overlap == "off",
                    "parallel.pp_overlap '{}' is not valid; use on or off", p.pp_overlap);
  const model::Recompute recompute = model::parse_recompute(c.loop.recompute);
  PARM_CONFIG_CHECK(c.loop.memory_limit >= 0,
                    "train.memory_limit {} must be >= 0 (bytes; 0: no limit)",
                    c.loop.memory_limit);
  const bool moe_layer =
      recompute == model::Recompute::kMoeAct || recompute == model::Recompute::kMoe;
  PARM_CONFIG_CHECK(!moe_layer || p.device == "cpu",
                    "--recompute {} (train.recompute) with --device {}: the MoE layer's "
                    "activations are recomputed by the CPU layer only; use --recompute block "
                    "or none there", c.loop.recompute, p.device);
  check_shared_overlap(m.shared_experts, p.shared_overlap);
  // (The order needs the world size: Topology::create checks it.)
  model::parse_pp_split(p.pp_split, p.pp, m.num_layers, "--pp-split (parallel.pp_split)");
  // Names first (their messages list the valid ones), then whether they can run here.
  const Device device = parse_device(p.device);
  const Precision precision = parse_precision(p.precision);
  parse_comm_backend(p.comm);
  // Before check_device: the message holds in a build or on a machine without a GPU too.
  moe::check_router_options(device, m.router_z_loss, m.router_bias_update, m.router);
  moe::check_expert_mlp(device, precision, m.expert_mlp);
  moe::check_shared_experts(device, precision, m.shared_experts);
  check_device(device, precision);
}

}  // namespace parm::train
