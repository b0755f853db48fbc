#include "perfmodel/measured_steps.h"

#include "parm/error.h"

namespace parm::perfmodel {

std::vector<double> last_pass_step_us(const MoeLayer& layer) {
  std::vector<double> out = layer.forward_step_us();
  const auto& bwd = layer.backward_step_us();
  out.insert(out.end(), bwd.begin(), bwd.end());
  return out;
}

double compute_us_of(const schedule::Schedule& sc, const std::vector<double>& step_us) {
  const size_t n = sc.steps.size();
  PARM_CHECK_EQ(step_us.size(), 2 * n);
  double us = 0.0;
  for (size_t i = 0; i < n; ++i)
    if (!schedule::is_collective(sc.steps[i].kind)) us += step_us[i] + step_us[n + i];
  return us;
}

}  // namespace parm::perfmodel
