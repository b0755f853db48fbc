#include "perfmodel/sweep_policies.h"

#include <fmt/format.h>

#include <algorithm>

#include "parm/error.h"

namespace parm::perfmodel {

const FixedPolicy* PolicyView::best_fixed() const {
  const FixedPolicy* best = nullptr;
  for (const FixedPolicy& f : fixed)
    if (f.configs > 0 && (best == nullptr || f.over_auto() < best->over_auto())) best = &f;
  return best;
}

PolicyView policy_view(const std::vector<PolicyConfig>& configs) {
  PolicyView v;
  std::map<std::string, FixedPolicy> fixed;
  for (const PolicyConfig& c : configs) {
    const auto chosen = c.measured_ms.find(c.auto_choice);
    PARM_CHECK(chosen != c.measured_ms.end(), "auto chose '{}', which was not measured",
               c.auto_choice);
    const double auto_ms = chosen->second;
    double fastest = auto_ms;
    for (const auto& [name, ms] : c.measured_ms) {
      fastest = std::min(fastest, ms);
      FixedPolicy& f = fixed[name];
      f.schedule = name;
      ++f.configs;
      f.total_ms += ms;
      f.auto_total_ms += auto_ms;
    }
    ++v.configs;
    v.auto_total_ms += auto_ms;
    v.fastest_total_ms += fastest;
  }
  for (auto& [name, f] : fixed) v.fixed.push_back(f);
  return v;
}

std::string policy_table(const PolicyView& v) {
  std::string t = fmt::format(
      "policies over {} configurations (measured totals): auto {:.2f} ms, per-configuration "
      "fastest {:.2f} ms, auto / fastest {:.3f}\n    {:<12} {:>8} {:>12} {:>12} {:>12}",
      v.configs, v.auto_total_ms, v.fastest_total_ms, v.auto_over_fastest(), "always",
      "configs", "total ms", "auto ms", "rule / auto");
  for (const FixedPolicy& f : v.fixed)
    t += fmt::format("\n    {:<12} {:>8} {:>12.2f} {:>12.2f} {:>12.3f}{}", f.schedule,
                     f.configs, f.total_ms, f.auto_total_ms, f.over_auto(),
                     f.over_auto() < 1.0 ? "  <- beats auto" : "");
  return t;
}

}  // namespace parm::perfmodel
