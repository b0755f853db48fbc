#include "train/run_report.h"

#include <cstdio>

#include <fmt/ranges.h>

#include "train/pipeline_schedule.h"

namespace parm::train {

void print_run_header(const TrainConfig& cfg, const Layout& lay,
                      const std::vector<std::string>& schedules, const data::Corpus& corpus,
                      const std::string& tokenizer, int64_t global_batch, const GemmRate& rate) {
  // The MoE layer as the layer commands name it (its H, router, experts' kind and shared
  // experts included), over one micro-batch, and how its exchanges move rows (unpadded).
  MoeShape shape = model::moe_shape(cfg.model, cfg.loop.micro_batch);
  shape.pad_to_capacity = cfg.parallel.pad_to_capacity;
  const std::string moe = shape.str();
  std::printf("parm train %s: %s, %lld layers (MoE every %d: %s), MoE layer %s\n",
              cfg.name.c_str(), cfg.model.arch == model::Arch::kGpt2 ? "GPT-2" : "BERT",
              static_cast<long long>(cfg.model.num_layers), cfg.model.moe_every,
              fmt::format("{}", fmt::join(schedules, ",")).c_str(), moe.c_str());
  std::printf("layout: %d ranks, pp=%d x (dp=%d mp=%d | edp=%d ep=%d esp=%d), order %s; global "
              "batch %lld x %lld tokens; corpus %s (%lld train / %lld val tokens, tokenizer %s); "
              "MFU against %.1f GFLOP/s per rank (%s)\n",
              lay.world, lay.pp, lay.dp, lay.mp, lay.edp, lay.ep, lay.esp,
              lay.order_name().c_str(),
              static_cast<long long>(global_batch), static_cast<long long>(cfg.model.seq_len),
              corpus.name.c_str(), static_cast<long long>(corpus.train.size()),
              static_cast<long long>(corpus.val.size()), tokenizer.c_str(), rate.gflops,
              rate.source.c_str());
}

void print_stages(Topology& topo, model::Model& model, const std::vector<model::Param*>& params,
                  const OptimizerMemory& opt, int num_micro, bool print) {
  const model::StageBlocks& s = model.stage();
  int64_t param_bytes = opt.grad_bytes + opt.state_bytes();
  for (const auto* p : params) param_bytes += p->value.bytes();
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

void print_summary(const std::string& name, const TrainResult& result, double wall_s) {
  std::printf("\n%-28s %s\n", "summary", name.c_str());
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
  std::printf("%-28s %.1f s\n", "wall time", wall_s);
  for (size_t r = 0; r < result.rank_memory.size(); ++r)
    std::printf("%-28s %s\n", fmt::format("peak MiB, rank {}", r).c_str(),
                memory_peaks_text(result.rank_memory[r]).c_str());
}

}  // namespace parm::train
