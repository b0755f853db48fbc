// The cost model judged as a policy over a sweep (`bench-layer --sweep`): the total measured
// time of running each configuration with auto's choice, against the per-configuration
// fastest and against every fixed rule ("always s1+fused"), each over the configurations
// where that rule's schedule exists. A model that a fixed rule beats is not doing its job,
// whatever its per-configuration accuracy.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

namespace parm::perfmodel {

// One measured configuration: each candidate's measured time (ms, by schedule name) and the
// name auto chose (one of them).
struct PolicyConfig {
  std::map<std::string, double> measured_ms;
  std::string auto_choice;
  // The same candidates measured by the even and by the odd rounds alone (two halves of the
  // measurement; empty where the configuration had one round).
  std::array<std::map<std::string, double>, 2> half_ms;
};

// A fixed rule over the configurations where its schedule exists.
struct FixedPolicy {
  std::string schedule;
  int configs = 0;             // configurations that have it
  double total_ms = 0.0;       // its measured total over them
  double auto_total_ms = 0.0;  // auto's over the same ones
  double over_auto() const { return auto_total_ms > 0.0 ? total_ms / auto_total_ms : 0.0; }
};

struct PolicyView {
  int configs = 0;
  double auto_total_ms = 0.0;     // auto's choice summed over every configuration
  double fastest_total_ms = 0.0;  // the per-configuration fastest, summed
  std::vector<FixedPolicy> fixed;  // one per schedule name that appears, in name order
  double auto_over_fastest() const {
    return fastest_total_ms > 0.0 ? auto_total_ms / fastest_total_ms : 0.0;
  }
  // The fixed rule that beats auto by the most (its over_auto() lowest), or null when none
  // exists.
  const FixedPolicy* best_fixed() const;
};

// Throws parm::Error when a configuration's auto choice is not among its candidates.
PolicyView policy_view(const std::vector<PolicyConfig>& configs);

// The policy view against the measurement's own noise. The per-configuration fastest is the
// minimum over noisy candidates, so its total is biased low (on a 2-core machine by several
// percent: the bias alone can put auto above 1.03x a perfect model's choice), and a fixed rule
// can "beat auto" by noise. Each half of the rounds (even, odd) is a measurement of its own:
//   - the views of the two halves; a fixed rule's verdict (beats auto or not) counts only
//     where both halves give it;
//   - the cross-checked fastest: per configuration the fastest by one half, timed by the
//     other, both ways, summed (the oracle without its selection bias), against auto's time
//     in both halves.
enum class Verdict { kBeatsAuto, kDoesNotBeatAuto, kHalvesDisagree };
struct PolicyHalves {
  int configs = 0;  // configurations measured in both halves (every one, or none)
  PolicyView even, odd;
  double auto_total_ms = 0.0;            // auto's time in both halves, summed
  double cross_fastest_total_ms = 0.0;   // the other half's time of each half's fastest
  double auto_over_cross_fastest() const {
    return cross_fastest_total_ms > 0.0 ? auto_total_ms / cross_fastest_total_ms : 0.0;
  }
  // By schedule name, the fixed rules of both halves.
  std::map<std::string, Verdict> verdicts;
};
// configs = 0 (and nothing else set) unless every configuration has both halves. Throws as
// policy_view does.
PolicyHalves policy_halves(const std::vector<PolicyConfig>& configs);
const char* verdict_name(Verdict v);  // "beats auto", "does not beat auto", "halves disagree"
// The lines the sweep prints after policy_table (empty when configs = 0).
std::string halves_table(const PolicyHalves& halves);

// The table the sweep prints: auto against the fastest, and every fixed rule against auto.
std::string policy_table(const PolicyView& view);

}  // namespace parm::perfmodel
