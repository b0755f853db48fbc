#include "parm/stats.h"

#include <algorithm>
#include <cmath>

#include "parm/error.h"

namespace parm {

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_over_mean(double busiest, double total, double n, double if_none) {
  PARM_CHECK(busiest >= 0.0 && total >= 0.0,
             "the busiest share {} and the total {} must be at least 0", busiest, total);
  return total > 0.0 ? busiest * n / total : if_none;
}

double max_over_mean(const std::vector<double>& loads, int n_groups, double if_none) {
  PARM_CHECK(n_groups >= 1 && !loads.empty() && loads.size() % static_cast<size_t>(n_groups) == 0,
             "{} expert loads cannot be split over {} EP ranks", loads.size(), n_groups);
  const size_t per_group = loads.size() / static_cast<size_t>(n_groups);
  double total = 0.0, busiest = 0.0;
  for (size_t j = 0; j < static_cast<size_t>(n_groups); ++j) {
    double mine = 0.0;
    for (size_t e = j * per_group; e < (j + 1) * per_group; ++e) {
      PARM_CHECK(loads[e] >= 0.0, "expert {}'s load {} must be at least 0", e, loads[e]);
      mine += loads[e];
    }
    total += mine;
    busiest = std::max(busiest, mine);
  }
  return max_over_mean(busiest, total, n_groups, if_none);
}

}  // namespace parm
