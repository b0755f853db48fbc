#include "train/step_metrics.h"

#include <cstdarg>
#include <cstdio>

#include <fmt/format.h>

#include "moe/load_balance.h"

namespace parm::train {
namespace {

// printf's formatting (the C library's rounding) into a string.
[[gnu::format(printf, 1, 2)]] std::string printf_string(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(static_cast<size_t>(n > 0 ? n : 0) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), format, again);
  va_end(again);
  out.pop_back();  // the terminating NUL
  return out;
}

}  // namespace

std::string progress_text(const StepMetrics& m, const ReportFields& f,
                          const std::string& schedules) {
  const std::string val = m.val_loss >= 0 ? fmt::format(" val {:.4f}", m.val_loss) : "";
  const std::string bubble =
      f.pipeline ? fmt::format("  bubble {:.1f}% (1F1B {:.1f}%)  moe-comm {:.1f} ms",
                               100.0 * m.bubble, 100.0 * m.bubble_1f1b, m.moe_comm_ms)
                 : "";
  const std::string z = f.z_loss ? fmt::format("  z {:.4f}", m.z_loss) : "";
  const LoadImbalance load{m.load_expert_max_over_mean, m.load_rank_max_over_mean};
  std::string text = printf_string(
      "step %5lld/%lld  loss %.4f%s  aux %.4f%s  lr %.2e  |g| %.3f  %7.0f tok/s  "
      "%7.1f ms (comm %.1f, compute %.1f, grad-norm %.1f, optimizer %.1f)  MFU %.1f%%%s  "
      "moe %s  load %s  mem MiB %s\n",
      static_cast<long long>(m.step), static_cast<long long>(f.total_steps), m.loss, val.c_str(),
      m.aux_loss, z.c_str(), m.lr, m.grad_norm, m.tokens_per_s, m.step_ms, m.comm_ms,
      m.compute_ms, m.grad_norm_ms, m.optimizer_ms, 100.0 * m.mfu, bubble.c_str(),
      schedules.c_str(), load.str().c_str(), memory_peaks_text(m.mem_peak_bytes).c_str());
  if (f.phase_times) {
    text += "        phases (ms, world rank 0):";
    for (int i = 0; i < m.phases.num; ++i)
      text += fmt::format("  {} {:.1f}", m.phases.names[i], m.phases.us[i] / 1e3);
    text += "\n";
  }
  return text;
}

nlohmann::json metrics_json(const StepMetrics& m, const ReportFields& f) {
  nlohmann::json line = {{"step", m.step},
                         {"loss", m.loss},
                         {"aux_loss", m.aux_loss},
                         {"lr", m.lr},
                         {"grad_norm", m.grad_norm},
                         {"step_ms", m.step_ms},
                         {"comm_ms", m.comm_ms},
                         {"compute_ms", m.compute_ms},
                         {"grad_norm_ms", m.grad_norm_ms},
                         {"optimizer_ms", m.optimizer_ms},
                         {"tokens_per_s", m.tokens_per_s},
                         {"mfu", m.mfu}};
  if (m.val_loss >= 0) line["val_loss"] = m.val_loss;
  const auto& mem = m.mem_peak_bytes;
  line["mem_peak_bytes"] = {{"parameters", mem[0]}, {"gradients", mem[1]},
                            {"optimizer", mem[2]},  {"activations", mem[3]},
                            {"other", mem[4]},      {"total", mem[5]}};
  if (f.z_loss) line["z_loss"] = m.z_loss;
  if (f.pipeline) {
    line["bubble"] = m.bubble;
    line["bubble_1f1b"] = m.bubble_1f1b;
    line["moe_comm_ms"] = m.moe_comm_ms;
  }
  if (f.phase_times) {
    nlohmann::json ph = nlohmann::json::object();
    for (int i = 0; i < m.phases.num; ++i) ph[m.phases.names[i]] = m.phases.us[i] / 1e3;
    line["phase_ms"] = ph;
  }
  if (m.load_expert_max_over_mean > 0) {
    line["load_expert_max_over_mean"] = m.load_expert_max_over_mean;
    line["load_rank_max_over_mean"] = m.load_rank_max_over_mean;
  }
  return line;
}

}  // namespace parm::train
