#include "train/loss_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace parm::train {

std::string loss_chart_svg(const std::vector<StepMetrics>& h, const std::string& title) {
  constexpr double kW = 720, kH = 420, kL = 70, kR = 20, kT = 40, kB = 50;
  double lo = 1e30, hi = -1e30;
  for (const auto& m : h) {
    lo = std::min(lo, m.loss);
    hi = std::max(hi, m.loss);
    if (m.val_loss >= 0) {
      lo = std::min(lo, m.val_loss);
      hi = std::max(hi, m.val_loss);
    }
  }
  if (!(hi > lo)) hi = lo + 1.0;
  const double x0 = static_cast<double>(h.front().step), x1 = std::max(x0 + 1.0, static_cast<double>(h.back().step));
  auto px = [&](double step) { return kL + (step - x0) / (x1 - x0) * (kW - kL - kR); };
  auto py = [&](double loss) { return kT + (hi - loss) / (hi - lo) * (kH - kT - kB); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\">{3}: loss per step</text>\n",
      kW, kH, kL, title);
  for (int i = 0; i <= 4; ++i) {  // horizontal grid with labels
    const double v = lo + (hi - lo) * i / 4.0;
    s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3f}</text>\n",
                     kL, kW - kR, py(v), py(v), kL - 6, py(v) + 4, v);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
                   (kL + kW - kR) / 2, kH - 12);
  s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" "
                   "text-anchor=\"end\">{}</text>\n",
                   kL, kH - kB + 16, h.front().step, kW - kR, kH - kB + 16, h.back().step);
  std::string train = "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const auto& m : h) train += fmt::format("{:.1f},{:.1f} ", px(static_cast<double>(m.step)), py(m.loss));
  s += train + "\"/>\n";
  std::string val = "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"";
  bool any_val = false;
  for (const auto& m : h)
    if (m.val_loss >= 0) {
      any_val = true;
      val += fmt::format("{:.1f},{:.1f} ", px(static_cast<double>(m.step)), py(m.val_loss));
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#d62728\"/>\n",
                       px(static_cast<double>(m.step)), py(m.val_loss));
    }
  if (any_val) s += val + "\"/>\n";
  s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#1f77b4\">train</text>"
                   "<text x=\"{}\" y=\"{}\" fill=\"#d62728\">validation</text>\n</svg>\n",
                   kW - 170, kT + 14, kW - 110, kT + 14);
  return s;
}

}  // namespace parm::train
