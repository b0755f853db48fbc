// `parm generate`: text from a trained checkpoint (any layout saved it), in one process.
// GPT-2: samples --max-tokens tokens after the prompt with a KV cache (model/kv_decoder.h);
// BERT (--mask): fills each [MASK] of the prompt. Deterministic under --seed.
#include <cmath>
#include <cstdio>
#include <map>

#include "cli_common.h"
#include "comm/process.h"
#include "data/batch.h"
#include "model/kv_decoder.h"
#include "parm/error.h"
#include "parm/rng.h"
#include "parm/timer.h"
#include "text_codec.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/train_config.h"

namespace parm::cli {
namespace {

constexpr const char* kMaskMarker = "[MASK]";

struct GenerateFlags {
  std::string checkpoint, prompt;
  int64_t max_tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1;
  bool mask = false;
};

void check_flags(const GenerateFlags& f) {
  PARM_CONFIG_CHECK(process::world_size() == 1,
                    "generate runs in one process (got {} ranks): run `parm generate ...` "
                    "or `scripts/parmrun -n 1 -- generate ...`",
                    process::world_size());
  PARM_CONFIG_CHECK(!f.prompt.empty(), "--prompt is empty: give the text to continue (or, "
                    "with --mask, the text with {} where a token is missing)", kMaskMarker);
  PARM_CONFIG_CHECK(f.max_tokens >= 1 && f.max_tokens <= 1000000,
                    "--max-tokens {} is not valid; valid: 1 to 1000000", f.max_tokens);
  PARM_CONFIG_CHECK(std::isfinite(f.temperature) && f.temperature >= 0.0 &&
                        f.temperature <= 100.0,
                    "--temperature {} is not valid; valid: 0 (always the most likely token) "
                    "to 100", f.temperature);
  PARM_CONFIG_CHECK(f.top_k >= 0, "--top-k {} is not valid; valid: 0 (every token) or a "
                    "positive count", f.top_k);
}

// The checkpoint's model, loaded whole into one process.
struct Loaded {
  model::ModelConfig config;
  nlohmann::json manifest;
  std::string folder;
  int64_t step = 0;
  std::map<std::string, Tensor> weights;
  std::vector<std::vector<float>> router_bias;
};

Loaded load(const std::string& path) {
  Loaded out;
  out.folder = train::resolve_checkpoint_folder(path);
  out.manifest = train::read_manifest_json(out.folder);
  const nlohmann::json& manifest = out.manifest;
  const std::string origin = out.folder + "/manifest.json";
  PARM_CONFIG_CHECK(manifest.is_object() && manifest.contains("model_config") &&
                        manifest.at("model_config").is_object(),
                    "{}: no model_config object: not a parm checkpoint", origin);
  out.config = train::parse_train_config({{"model", manifest.at("model_config")}}, origin).model;
  // The training model on one rank holds every tensor whole; the loader checks the manifest,
  // the shapes and the checksums before it fills them.
  TopologyOptions o;
  o.self_only = true;
  auto topo = Topology::create(o);
  auto m = model::make_model(*topo, out.config, {}, 1);
  train::AdamW moments(m->params());
  const train::CheckpointState st =
      train::load_checkpoint(*topo, out.folder, m->all_param_specs(), m->params(), moments,
                             train::model_config_json(out.config),
                             manifest.value("tokenizer", nlohmann::json()));
  out.step = st.step;
  for (model::Param* p : m->params()) out.weights.emplace(p->name, p->value.clone());
  if (st.router_bias.is_array())
    for (const auto& layer : st.router_bias) out.router_bias.push_back(layer.get<std::vector<float>>());
  return out;
}

// The text and a newline on stdout, every byte of it (a model's bytes may hold a 0).
void print_text(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

int run_generate(const GenerateFlags& f) {
  check_flags(f);
  Loaded ck = load(f.checkpoint);
  const bool bert = ck.config.arch == model::Arch::kBert;
  PARM_CONFIG_CHECK(bert == f.mask,
                    "checkpoint {} holds a {} model: {}", ck.folder, bert ? "BERT" : "GPT-2",
                    bert ? "it fills masks: add --mask and mark each missing token [MASK]"
                         : "it continues text: drop --mask");
  const auto codec = make_text_codec(ck.manifest, ck.folder);
  model::KvDecoder dec(ck.config, ck.weights, ck.router_bias);
  Rng rng(f.seed, 0);
  const int64_t L = dec.max_positions(), V = dec.vocab();
  const double t0 = now_us();
  std::vector<int32_t> out;  // the generated ids (GPT-2) or the filled sequence (BERT)
  if (bert) {
    // Each [MASK] of the prompt is one masked token; the rest is encoded around them.
    std::vector<int32_t> ids;
    std::vector<int64_t> masked;
    size_t pos = 0;
    for (;;) {
      const size_t at = f.prompt.find(kMaskMarker, pos);
      const auto part = codec->encode(f.prompt.substr(pos, at == std::string::npos
                                                                ? std::string::npos
                                                                : at - pos));
      ids.insert(ids.end(), part.begin(), part.end());
      if (at == std::string::npos) break;
      masked.push_back(static_cast<int64_t>(ids.size()));
      ids.push_back(codec->mask_id());
      pos = at + std::string(kMaskMarker).size();
    }
    PARM_CONFIG_CHECK(!masked.empty(), "--mask: the prompt has no {} to fill", kMaskMarker);
    PARM_CONFIG_CHECK(static_cast<int64_t>(ids.size()) <= L,
                      "--prompt is {} tokens; this BERT model reads at most {}", ids.size(), L);
    const std::vector<float> logits = dec.forward(ids);
    for (int64_t t : masked) {
      // A filled position gets a byte, never [MASK] itself (the MLM head's extra id).
      std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      if (V > codec->mask_id()) row[static_cast<size_t>(codec->mask_id())] = -INFINITY;
      ids[static_cast<size_t>(t)] =
          model::sample_token(row.data(), V, f.temperature, f.top_k, rng.uniform());
    }
    out = ids;
    print_text(codec->decode(out));
  } else {
    std::vector<int32_t> text = codec->encode(f.prompt);
    // The cache holds L positions: a longer prompt keeps its last L; when the cache is full,
    // it is filled again from the last L / 2 tokens (their positions start again at 0).
    std::vector<int32_t> ctx(text.end() - std::min<int64_t>(L, text.size()), text.end());
    std::vector<float> logits = dec.forward(ctx);
    const float* last = logits.data() + (static_cast<int64_t>(ctx.size()) - 1) * V;
    for (int64_t i = 0; i < f.max_tokens; ++i) {
      const int32_t tok = model::sample_token(last, V, f.temperature, f.top_k, rng.uniform());
      out.push_back(tok);
      text.push_back(tok);
      if (dec.length() == L) {
        const int64_t keep = std::max<int64_t>(1, L / 2);
        logits = dec.forward(std::vector<int32_t>(text.end() - keep, text.end()));
        last = logits.data() + (keep - 1) * V;
      } else {
        logits = dec.append({tok});
        last = logits.data();
      }
    }
    print_text(f.prompt + codec->decode(out));
  }
  std::fflush(stdout);
  const double s = (now_us() - t0) * 1e-6;
  std::fprintf(stderr,
               "generate: %s, step %ld, %s tokenizer; %ld token%s in %.2f s (%.1f tokens/s), "
               "seed %lu, temperature %g, top-k %ld\n",
               ck.folder.c_str(), static_cast<long>(ck.step), codec->name().c_str(),
               static_cast<long>(bert ? 0 : out.size()), out.size() == 1 ? "" : "s", s,
               bert ? 0.0 : static_cast<double>(out.size()) / std::max(s, 1e-9),
               static_cast<unsigned long>(f.seed), f.temperature, static_cast<long>(f.top_k));
  return 0;
}

}  // namespace

Command add_generate(CLI::App& root) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* app = root.add_subcommand(
      "generate", "text from a trained checkpoint: GPT-2 continues --prompt; BERT (--mask) "
                  "fills each [MASK] of it");
  app->add_option("--checkpoint", f->checkpoint,
                  "a checkpoint folder, or a save dir (its latest checkpoint)")
      ->required();
  app->add_option("--prompt", f->prompt, "the text to continue (BERT: with [MASK]s to fill)")
      ->required();
  app->add_option("--max-tokens", f->max_tokens, "tokens to generate (GPT-2; default 200)");
  app->add_option("--temperature", f->temperature,
                  "sampling temperature (default 1; 0: always the most likely token)");
  app->add_option("--top-k", f->top_k, "sample among the K most likely tokens (default 0: all)");
  app->add_option("--seed", f->seed, "seed of the sampling (default 1)");
  app->add_flag("--mask", f->mask,
                "fill masks (BERT checkpoints): each [MASK] in --prompt is one missing token");
  return {app, [f] { return run_generate(*f); }};
}

}  // namespace parm::cli
