#include "perfmodel/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shape/shape.h"
#include "parm/error.h"
#include "parm/stats.h"
#include "perfmodel/json_reader.h"

namespace parm::perfmodel {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string xml_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}
}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& origin) {
  JsonReader r("cluster file", origin);
  if (!j.is_object()) r.fail("the top level must be a JSON object");
  ClusterSpec c;
  c.name = r.text(j, "", "name");
  c.nodes = static_cast<int>(r.integer(j, "", "nodes", 1));
  c.devices_per_node = static_cast<int>(r.integer(j, "", "devices_per_node", 1));
  Profile& p = c.profile;
  p.machine = {{"cluster", c.name}, {"nodes", c.nodes}, {"devices_per_node", c.devices_per_node}};
  if (j.contains("description")) p.machine["description"] = j.at("description");
  for (Link link : {Link::kIntra, Link::kInter}) {
    const std::string lname = link_name(link);
    // One node has no inter-node link; its entry may be left out (then the intra values).
    const bool optional = link == Link::kInter && c.nodes == 1;
    const nlohmann::json& e =
        optional && !j.contains(lname) ? r.object(j, "", "intra") : r.object(j, "", lname);
    const std::string path = optional && !j.contains(lname) ? "intra" : lname;
    CommFit f;
    f.alpha_us = r.number(e, path, "alpha_us", 0.0, true);
    f.beta_us_per_byte = r.number(e, path, "beta_us_per_byte", 0.0, true);
    if (e.contains("alpha_per_rank_us"))
      f.alpha_per_rank_us = r.number(e, path, "alpha_per_rank_us", 0.0, true);
    // The handshake above the eager limit (model.h): inter-node only, with the limit below.
    if (e.contains("handshake_us")) {
      if (path != "inter")
        r.fail("'{}.handshake_us': the handshake is priced on the inter-node link only (valid: "
               "inter.handshake_us, with fused_eager_limit_bytes)",
               path);
      f.handshake_us = r.number(e, path, "handshake_us", 0.0, true);
      f.handshake_source = "assumed";
    }
    f.source = "assumed";
    f.alpha_per_rank_source = "assumed";
    for (auto& fit : p.comm[static_cast<size_t>(link)]) fit = f;
  }
  const auto& g = r.object(j, "", "gemm");
  GemmFit gf;
  gf.gflops = r.number(g, "gemm", "tflops", 0.0, false) * 1e3;
  gf.alpha_us = r.number(g, "gemm", "alpha_us", 0.0, true);
  p.gemm.fill(gf);
  const auto& m = r.object(j, "", "memory");
  MemFit mf;
  mf.gbps = r.number(m, "memory", "gbps", 0.0, false);
  mf.alpha_us = r.number(m, "memory", "alpha_us", 0.0, true);
  p.mem.fill(mf);
  p.fused.overlap = r.number(j, "", "fused_overlap", kMinOverlap, true, 1.0);
  if (j.contains("step_sync_us")) p.step_sync.us = r.number(j, "", "step_sync_us", 0.0, true);
  if (j.contains("step_sync_per_compute"))
    p.step_sync.per_compute = r.number(j, "", "step_sync_per_compute", 0.0, true);
  if (j.contains("step_sync_compute_cap_us"))
    p.step_sync.compute_cap_us = r.number(j, "", "step_sync_compute_cap_us", 0.0, true);
  // One rendezvous for every group, but for the steps within a node where the file gives
  // their own (step_sync_intra_us / _per_compute / _compute_cap_us, issue 42; model.h).
  p.step_sync_world = p.step_sync_intra = p.step_sync;
  if (j.contains("step_sync_intra_us"))
    p.step_sync_intra.us = r.number(j, "", "step_sync_intra_us", 0.0, true);
  if (j.contains("step_sync_intra_per_compute"))
    p.step_sync_intra.per_compute = r.number(j, "", "step_sync_intra_per_compute", 0.0, true);
  if (j.contains("step_sync_intra_compute_cap_us"))
    p.step_sync_intra.compute_cap_us =
        r.number(j, "", "step_sync_intra_compute_cap_us", 0.0, true);
  if (j.contains("fused_per_piece_us"))
    p.fused.per_piece_us = r.number(j, "", "fused_per_piece_us", 0.0, true);
  // The rendezvous a fused step's pieces avoid (model.h, eager_saving_us): both or neither.
  if (p.collective(Link::kInter, CommOp::kAllToAll).handshake_us > 0.0 &&
      !j.contains("fused_eager_limit_bytes"))
    r.fail("'inter.handshake_us' needs 'fused_eager_limit_bytes', the eager limit above which a "
           "message pays it");
  if (j.contains("fused_eager_gain") || j.contains("fused_eager_limit_bytes")) {
    p.fused.eager_gain = r.number(j, "", "fused_eager_gain", 0.0, true, 1.0);
    p.fused.eager_limit_bytes = r.number(j, "", "fused_eager_limit_bytes", 0.0, true);
    p.fused.eager_gain_mixed =
        j.contains("fused_eager_gain_mixed")
            ? r.number(j, "", "fused_eager_gain_mixed", 0.0, true, 1.0)
            : p.fused.eager_gain;
  }
  return c;
}

ClusterSpec read_cluster(const std::string& path) {
  return cluster_from_json(read_json_file("cluster file", path), path);
}

Grid grid_from_json(const nlohmann::json& j, const std::string& origin) {
  JsonReader r("grid file", origin);
  if (!j.is_object()) r.fail("the top level must be a JSON object");
  Grid g;
  g.name = j.contains("name") ? r.text(j, "", "name") : origin;
  if (j.contains("chunks")) g.chunks = static_cast<int>(r.integer(j, "", "chunks", 1));
  if (j.contains("order")) {
    g.order = r.text(j, "", "order");
    try {
      make_layout(1, 1, 1, 1, 1, g.order);  // the names; each layout checks the rest
    } catch (const InvalidConfig& e) {
      r.fail("'order': {}", e.what());
    }
  }
  auto ints = [&](const char* key) {
    std::vector<int64_t> v;
    const auto& a = r.array(j, "", key);
    for (size_t i = 0; i < a.size(); ++i)
      v.push_back(r.integer_value(a[i], fmt::format("{}[{}]", key, i), 1));
    return v;
  };
  std::vector<std::string> fs;
  {
    const auto& a = r.array(j, "", "f");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string key = fmt::format("f[{}]", i);
      std::string text;
      if (a[i].is_string())
        text = a[i].get<std::string>();
      else if (a[i].is_number())
        text = a[i].dump();  // shortest round-trip decimal: 1.2 -> "1.2"
      else
        r.fail("'{}' must be a decimal (number or string), got {}", key, a[i].dump());
      try {
        CapacityFactor::parse(text);
      } catch (const InvalidConfig& e) {
        r.fail("'{}': {}", key, e.what());
      }
      fs.push_back(text);
    }
  }
  const auto B = ints("B"), L = ints("L"), M = ints("M"), H = ints("H"), E = ints("E"),
             k = ints("k"), mp = ints("N_MP"), esp = ints("N_ESP"), ep = ints("N_EP");
  for (auto b : B) for (auto l : L) for (auto m : M) for (auto h : H) for (auto e : E)
  for (auto kk : k) for (const auto& f : fs) for (auto a : mp) for (auto s : esp) for (auto p : ep) {
    GridConfig c;
    c.B = b; c.L = l; c.M = m; c.H = h; c.E = e;
    c.k = static_cast<int>(kk);
    c.f = f;
    c.mp = static_cast<int>(a);
    c.esp = static_cast<int>(s);
    c.ep = static_cast<int>(p);
    g.configs.push_back(c);
  }
  return g;
}

Grid read_grid(const std::string& path) {
  return grid_from_json(read_json_file("grid file", path), path);
}

MoeShape GridConfig::shape() const { return MoeShape::of(tokens(), M, H, E, k, f); }

std::vector<SimRow> simulate(const ClusterSpec& cluster, const Grid& grid) {
  using schedule::Kind;
  std::vector<SimRow> rows;
  const int world = cluster.devices();
  for (const GridConfig& c : grid.configs) {
    SimRow row;
    row.config = c;
    row.baseline_ms = row.s1_ms = row.s1_fused_ms = row.s2_ms = row.s2_fused_ms = kNaN;
    row.speedup = kNaN;
    try {
      const Target t =
          make_target(world, c.mp, c.ep, c.esp, cluster.devices_per_node, grid.order);
      const MoeShape shape = c.shape();
      const auto cands = predict_candidates(cluster.profile, shape, t, grid.chunks,
                                            {Kind::kBaseline, Kind::kS1, Kind::kS2},
                                            {false, true});
      row.mp_link = group_link(t, Group::kMp);
      row.esp_link = group_link(t, Group::kEsp);
      row.ep_link = group_link(t, Group::kEp);
      for (const auto& cand : cands) {
        const double ms = cand.pred.total_us() / 1e3;
        if (cand.kind == Kind::kBaseline) row.baseline_ms = ms;
        if (cand.kind == Kind::kS1) (cand.pred.fused ? row.s1_fused_ms : row.s1_ms) = ms;
        if (cand.kind == Kind::kS2) (cand.pred.fused ? row.s2_fused_ms : row.s2_ms) = ms;
      }
      const auto& best = cands[choose(cands)].pred;
      row.choice = best.name();
      row.auto_ms = best.total_us() / 1e3;
      row.auto_fwd_ms = best.fwd_us / 1e3;
      row.auto_bwd_ms = best.bwd_us / 1e3;
      if (!std::isnan(row.baseline_ms))
        row.speedup = row.baseline_ms / row.auto_ms;
      else
        row.note = "no baseline for this layout (N_MP > 1, N_ESP not 1 and the ESP groups not the MP groups)";
      row.evaluated = true;
    } catch (const InvalidConfig& e) {
      row.note = fmt::format("skipped on {} ({} devices): {}", cluster.name, world, e.what());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}


double share_above(const std::vector<double>& v, double mark) {
  if (v.empty()) return kNaN;
  return static_cast<double>(std::count_if(v.begin(), v.end(), [&](double x) { return x > mark; })) /
         static_cast<double>(v.size());
}

SimSummary summarize(const std::vector<SimRow>& rows) {
  SimSummary s;
  std::vector<double> sp;
  for (const auto& r : rows) {
    ++s.configs;
    if (!r.evaluated) {
      ++s.skipped;
      continue;
    }
    ++s.evaluated;
    if (!std::isnan(r.speedup)) sp.push_back(r.speedup);
    const bool fused = r.choice.find("+fused") != std::string::npos;
    if (r.choice.rfind("baseline", 0) == 0) ++s.choose_baseline;
    if (r.choice.rfind("s1", 0) == 0) ++s.choose_s1;
    if (r.choice.rfind("s2", 0) == 0) ++s.choose_s2;
    (fused ? s.choose_fused : s.choose_unfused) += 1;
  }
  s.with_baseline = static_cast<int64_t>(sp.size());
  if (!sp.empty()) {
    s.speedup_min = *std::min_element(sp.begin(), sp.end());
    s.speedup_max = *std::max_element(sp.begin(), sp.end());
    s.speedup_median = median(sp);
    double lg = 0.0;
    for (double v : sp) lg += std::log(v);
    s.speedup_geomean = std::exp(lg / static_cast<double>(sp.size()));
    s.share_above_1_13 = share_above(sp, 1.13);
  }
  return s;
}

nlohmann::json SimSummary::to_json() const {
  auto share = [&](int64_t n) { return evaluated ? static_cast<double>(n) / evaluated : 0.0; };
  return {{"configs", configs},
          {"evaluated", evaluated},
          {"skipped", skipped},
          {"with_baseline", with_baseline},
          {"speedup_auto_over_baseline",
           {{"min", speedup_min}, {"median", speedup_median}, {"max", speedup_max},
            {"geomean", speedup_geomean}, {"count", with_baseline},
            {"share_above_1_13", share_above_1_13}}},
          {"choice_share",
           {{"baseline", share(choose_baseline)}, {"s1", share(choose_s1)},
            {"s2", share(choose_s2)}, {"fused", share(choose_fused)},
            {"unfused", share(choose_unfused)}}},
          {"choice_count",
           {{"baseline", choose_baseline}, {"s1", choose_s1}, {"s2", choose_s2},
            {"fused", choose_fused}, {"unfused", choose_unfused}}}};
}

std::string SimSummary::str() const {
  auto pct = [&](int64_t n) { return evaluated ? 100.0 * n / evaluated : 0.0; };
  std::string out = fmt::format(
      "configurations: {} in the grid, {} evaluated, {} skipped; {} with a baseline\n", configs,
      evaluated, skipped, with_baseline);
  if (with_baseline > 0)
    out += fmt::format("speedup of auto over baseline: min {:.3f}  median {:.3f}  max {:.3f}  "
                       "(geomean {:.3f}); above 1.13x: {:.1f}%\n",
                       speedup_min, speedup_median, speedup_max, speedup_geomean,
                       100.0 * share_above_1_13);
  out += fmt::format("auto chose: s1 {:.1f}%  s2 {:.1f}%  baseline {:.1f}%  |  fused {:.1f}%  "
                     "unfused {:.1f}%\n",
                     pct(choose_s1), pct(choose_s2), pct(choose_baseline), pct(choose_fused),
                     pct(choose_unfused));
  return out;
}

std::string sim_csv(const std::vector<SimRow>& rows) {
  std::string out =
      "id,B,L,T,M,H,E,k,f,N_MP,N_ESP,N_EP,mp_link,esp_link,ep_link,baseline_ms,s1_ms,"
      "s1_fused_ms,s2_ms,s2_fused_ms,auto,auto_ms,auto_fwd_ms,auto_bwd_ms,"
      "speedup_auto_vs_baseline,note\n";
  auto num = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.4f}", v); };
  for (size_t i = 0; i < rows.size(); ++i) {
    const SimRow& r = rows[i];
    const GridConfig& c = r.config;
    std::string note = r.note;
    std::replace(note.begin(), note.end(), '"', '\'');
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},", i, c.B, c.L, c.tokens(), c.M, c.H,
                       c.E, c.k, c.f, c.mp, c.esp, c.ep);
    if (r.evaluated)
      out += fmt::format("{},{},{},", link_name(r.mp_link), link_name(r.esp_link),
                         link_name(r.ep_link));
    else
      out += ",,,";
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},\"{}\"\n", num(r.baseline_ms), num(r.s1_ms),
                       num(r.s1_fused_ms), num(r.s2_ms), num(r.s2_fused_ms), r.choice,
                       r.evaluated ? num(r.auto_ms) : "", r.evaluated ? num(r.auto_fwd_ms) : "",
                       r.evaluated ? num(r.auto_bwd_ms) : "", num(r.speedup), note);
  }
  return out;
}

std::string speedup_svg(const std::vector<SimRow>& rows, const SimSummary& s,
                        const std::string& title) {
  std::vector<double> sp;
  for (const auto& r : rows)
    if (r.evaluated && !std::isnan(r.speedup)) sp.push_back(r.speedup);
  const double W = 720, Hh = 420, left = 70, right = 20, top = 50, bottom = 60;
  const double pw = W - left - right, ph = Hh - top - bottom;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{3}</text>\n",
      W, Hh, W / 2, xml_escape(title));
  if (sp.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no configuration with a "
                       "baseline</text>\n</svg>\n",
                       W / 2, Hh / 2);
    return svg;
  }
  // Bins of 0.05 (or wider, so that there are at most 40) from floor(min) to ceil(max).
  double lo = std::floor(s.speedup_min * 10.0) / 10.0, hi = std::ceil(s.speedup_max * 10.0) / 10.0;
  if (hi <= lo) hi = lo + 0.1;
  double width = 0.05;
  while ((hi - lo) / width > 40) width *= 2;
  const int nbins = std::max(1, static_cast<int>(std::ceil((hi - lo) / width - 1e-9)));
  hi = lo + nbins * width;
  std::vector<int> counts(static_cast<size_t>(nbins), 0);
  for (double v : sp)
    ++counts[static_cast<size_t>(std::clamp(static_cast<int>((v - lo) / width), 0, nbins - 1))];
  const int cmax = *std::max_element(counts.begin(), counts.end());
  auto xpos = [&](double v) { return left + (v - lo) / (hi - lo) * pw; };
  auto ypos = [&](double c) { return top + ph - c / cmax * ph; };
  for (int b = 0; b < nbins; ++b) {
    const double x0 = xpos(lo + b * width), x1 = xpos(lo + (b + 1) * width);
    const double y = ypos(counts[static_cast<size_t>(b)]);
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                       "fill=\"#4878cf\" stroke=\"white\"><title>[{:.2f}, {:.2f}): {}</title>"
                       "</rect>\n",
                       x0, y, std::max(0.0, x1 - x0), top + ph - y, lo + b * width,
                       lo + (b + 1) * width, counts[static_cast<size_t>(b)]);
  }
  // Axes, ticks, labels.
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n"
                     "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"black\"/>\n",
                     left, top + ph, left + pw, top);
  const double xstep = std::max(width, std::ceil((hi - lo) / 10.0 / width) * width);
  for (double v = lo; v <= hi + 1e-9; v += xstep)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"black\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:.2f}</text>\n",
                       xpos(v), top + ph, top + ph + 5, top + ph + 18, v);
  // A round tick step (1, 2 or 5 times a power of ten) giving at most about 6 ticks.
  int ystep = 1;
  for (int mag = 1; ystep * 6 < cmax; mag *= 10)
    for (int m : {1, 2, 5})
      if (ystep * 6 < cmax) ystep = m * mag;
  for (int c = 0; c <= cmax; c += ystep)
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"black\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       left - 5, ypos(c), left, left - 8, ypos(c) + 4, c);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">predicted speedup of auto "
                     "over baseline (baseline time / auto time)</text>\n",
                     left + pw / 2, Hh - 15);
  svg += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
                     "{0})\">configurations</text>\n",
                     top + ph / 2);
  // Reference lines: 1.0 (no gain) and the median.
  auto vline = [&](double v, const char* color, const std::string& label) {
    if (v < lo || v > hi) return;
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"{3}\" "
                       "stroke-dasharray=\"5,3\"/><text x=\"{4:.1f}\" y=\"{5}\" fill=\"{3}\">{6}"
                       "</text>\n",
                       xpos(v), top, top + ph, color, xpos(v) + 4, top + 12, label);
  };
  vline(1.0, "#888888", "1.0");
  vline(s.speedup_median, "#c03030", fmt::format("median {:.3f}", s.speedup_median));
  svg += fmt::format("<text x=\"{}\" y=\"40\" text-anchor=\"end\" fill=\"#444444\">n = {}, min "
                     "{:.3f}, max {:.3f}</text>\n",
                     left + pw, sp.size(), s.speedup_min, s.speedup_max);
  svg += "</svg>\n";
  return svg;
}

}  // namespace parm::perfmodel
