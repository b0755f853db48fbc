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

PolicyHalves policy_halves(const std::vector<PolicyConfig>& configs) {
  PolicyHalves h;
  std::array<std::vector<PolicyConfig>, 2> half;
  for (const PolicyConfig& c : configs) {
    if (c.half_ms[0].empty() || c.half_ms[1].empty()) return PolicyHalves{};
    for (int i = 0; i < 2; ++i) {
      PARM_CHECK(c.half_ms[i].size() == c.measured_ms.size(),
                 "a half of the rounds measured {} candidates of {}", c.half_ms[i].size(),
                 c.measured_ms.size());
      half[i].push_back({c.half_ms[i], c.auto_choice, {}});
    }
    // The fastest by half i, timed by the other half.
    for (int i = 0; i < 2; ++i) {
      const auto& by = c.half_ms[i];
      const auto best = std::min_element(by.begin(), by.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      });
      h.cross_fastest_total_ms += c.half_ms[1 - i].at(best->first);
    }
  }
  if (configs.empty()) return h;
  h.even = policy_view(half[0]);
  h.odd = policy_view(half[1]);
  h.configs = h.even.configs;
  h.auto_total_ms = h.even.auto_total_ms + h.odd.auto_total_ms;
  for (size_t i = 0; i < h.even.fixed.size(); ++i) {
    const bool e = h.even.fixed[i].over_auto() < 1.0, o = h.odd.fixed[i].over_auto() < 1.0;
    h.verdicts[h.even.fixed[i].schedule] =
        e != o ? Verdict::kHalvesDisagree : e ? Verdict::kBeatsAuto : Verdict::kDoesNotBeatAuto;
  }
  return h;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kBeatsAuto: return "beats auto";
    case Verdict::kDoesNotBeatAuto: return "does not beat auto";
    case Verdict::kHalvesDisagree: return "halves disagree";
  }
  return "?";
}

std::string halves_table(const PolicyHalves& h) {
  if (h.configs == 0) return "";
  std::string t = fmt::format(
      "the same from each half of the rounds (even | odd): auto / fastest {:.3f} | {:.3f}; "
      "auto / the fastest chosen by one half and timed by the other (no selection bias) "
      "{:.3f}\n    {:<12} {:>8} {:>8}  verdict",
      h.even.auto_over_fastest(), h.odd.auto_over_fastest(), h.auto_over_cross_fastest(),
      "always", "even", "odd");
  for (size_t i = 0; i < h.even.fixed.size(); ++i)
    t += fmt::format("\n    {:<12} {:>8.3f} {:>8.3f}  {}", h.even.fixed[i].schedule,
                     h.even.fixed[i].over_auto(), h.odd.fixed[i].over_auto(),
                     verdict_name(h.verdicts.at(h.even.fixed[i].schedule)));
  return t;
}

}  // namespace parm::perfmodel
