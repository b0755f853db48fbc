// The cost model judged as a policy over a sweep (`bench-layer --sweep`): the total measured
// time of running each configuration with auto's choice, against the per-configuration
// fastest and against every fixed rule ("always s1+fused"), each over the configurations
// where that rule's schedule exists. A model that a fixed rule beats is not doing its job,
// whatever its per-configuration accuracy.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace parm::perfmodel {

// One measured configuration: each candidate's measured time (ms, by schedule name) and the
// name auto chose (one of them).
struct PolicyConfig {
  std::map<std::string, double> measured_ms;
  std::string auto_choice;
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

// The table the sweep prints: auto against the fastest, and every fixed rule against auto.
std::string policy_table(const PolicyView& view);

}  // namespace parm::perfmodel
