// The equivalence suite: every schedule, for every layout of the sweep, matches the
// single-process oracle (outputs, dx, l_aux, dWg and every expert-weight gradient); and the
// bytes the communicator counted match docs/spec.md §3's table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <map>
#include <string>

#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

using schedule::Kind;

// fp32 layer against the fp64 oracle: sums of at most a few hundred fp32 products, so errors
// stay near 1e-6 of the tensor's largest magnitude; 2e-4 leaves room without hiding a
// factor-of-N_MP or partial-sum bug (those give errors of order 1).
constexpr double kTolerance = 2e-4;

struct Layout3 {
  int mp, ep, esp;
  int pp = 1;
  const char* order = kDefaultOrder;

  Layout layout() const { return make_layout(test::world_size(), mp, ep, esp, pp, order); }
  std::string str() const {
    return fmt::format("mp={} ep={} esp={} pp={} order {}", mp, ep, esp, pp, layout().order_name());
  }
};

// The layer runs inside one pipeline stage: under pp > 1 each stage is an independent copy
// (its own MP groups, inputs and expert shards), and the oracle sums over all MP groups.
std::unique_ptr<Topology> topology_of(const Layout3& l) {
  return Topology::create(
      {.mp = l.mp, .ep = l.ep, .esp = l.esp, .pp = l.pp, .order = l.order, .timeout_s = 120.0});
}

// Nests every group differently from the default: dp and edp innermost, mp and esp outermost
// (both at stride P / N, so with N_ESP = N_MP the ESP groups are still the MP groups).
constexpr const char* kReversedOrder = "dp-ep-esp-mp-pp";
// MP innermost, ESP outermost: with N_ESP = N_MP > 1 the ESP groups are not the MP groups
// (the baseline is refused there; S1 and S2 must not depend on them coinciding).
constexpr const char* kEspApartOrder = "mp-ep-dp-esp-pp";
// pp innermost: each stage strided over the world (valid for every layout).
constexpr const char* kPpInnerOrder = "pp-dp-ep-esp-mp";

// Each layout under the default order (and the reversed one with `reversed`); a few under
// other orders and with two pipeline stages.
std::vector<Layout3> sweep_layouts(bool reversed = true) {
  std::vector<Layout3> base;
  switch (test::world_size()) {
    case 1: base = {{1, 1, 1}}; break;
    case 2: base = {{1, 2, 1}, {2, 1, 2}, {2, 2, 1}, {1, 1, 2}, {1, 1, 1}}; break;
    case 3: base = {{1, 3, 1}, {3, 1, 3}}; break;
    case 4: base = {{2, 2, 2}, {4, 1, 4}, {1, 4, 1}, {2, 2, 1}, {2, 1, 2}, {2, 1, 4}, {1, 2, 2}};
      break;
    case 8: base = {{2, 4, 2}, {4, 2, 4}, {2, 2, 2}, {1, 8, 1}, {2, 4, 1}}; break;
    default: return {};
  }
  std::vector<Layout3> out;
  for (const Layout3& l : base) {
    out.push_back(l);
    if (reversed && test::world_size() > 1) out.push_back({l.mp, l.ep, l.esp, 1, kReversedOrder});
  }
  switch (test::world_size()) {
    case 2: out.push_back({1, 1, 1, 2}); break;
    case 4:
      out.push_back({2, 2, 2, 1, kEspApartOrder});
      out.push_back({2, 2, 1, 1, "mp-dp-ep"});  // 2 nodes x 2: MP inside, EP across
      out.push_back({2, 1, 2, 2});
      out.push_back({1, 2, 1, 2, kPpInnerOrder});
      break;
    case 8:
      out.push_back({2, 4, 2, 1, kEspApartOrder});
      out.push_back({2, 2, 2, 2});
      out.push_back({2, 2, 1, 2, kPpInnerOrder});
      break;
    default: break;
  }
  return out;
}

struct Case {
  const char* name;
  int topk;
  const char* f;
  float skew;
};

// Capacity factors that drop and ones that do not; experts that get no token; one expert
// that overflows.
constexpr Case kCases[] = {
    {"k1 no drops", 1, "8.0", 0.0f},
    {"k2 drops", 2, "1.0", 0.0f},
    {"k3 heavy drops", 3, "0.5", 0.0f},
    {"k1 skewed: expert 0 overflows, others empty", 1, "1.25", 3.0f},
    {"k2 skewed", 2, "1.5", 3.0f},
    // Dropless: variable-size exchanges of the routed rows only.
    {"k2 dropless", 2, "none", 0.0f},
    {"k1 dropless skewed: expert 0 takes most, others none", 1, "none", 3.0f},
};

bool allowed(Kind kind, const Layout3& l) {
  return schedule::supports(kind, l.layout());
}

// The check of one case on T = 24 tokens per MP group (3 pipeline chunks when fused).
LayerCheckOptions case_options(const Case& c, Kind kind, bool fuse, int64_t experts,
                               int64_t model_dim, int64_t hidden) {
  LayerCheckOptions o;
  o.fuse = fuse;
  o.chunks = 3;
  o.shape.tokens = 24;
  o.shape.model_dim = model_dim;
  o.shape.hidden = hidden;
  o.shape.experts = experts;
  o.shape.topk = c.topk;
  o.shape.capacity_factor = CapacityFactor::parse(c.f);
  o.kind = kind;
  o.skew = c.skew;
  return o;
}

TEST(Equivalence, EveryScheduleEveryLayoutMatchesTheOracle) {
  int64_t checks = 0, with_drops = 0, without_drops = 0;
  for (const Layout3& lay : sweep_layouts()) {
    auto topo = topology_of(lay);
    const int64_t experts = test::world_size() == 3 ? 6 : 8;
    for (const Case& c : kCases) {
      for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
      for (bool fuse : {false, true}) {
        if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
        // T = 24 per MP group: divisible by N_MP in {1, 2, 3, 4}; H by N_ESP up to 8.
        LayerCheckOptions o = case_options(c, kind, fuse, experts, 8, 24);
        o.seed = 11;
        o.tolerance = kTolerance;
        const LayerCheckResult r = check_layer(*topo, o);
        ++checks;
        (r.dropped_choices > 0 ? with_drops : without_drops) += 1;
        if (std::string(c.f) == "none") EXPECT_EQ(r.dropped_choices, 0) << c.name;
        std::string detail;
        for (const auto& e : r.errors)
          detail += fmt::format(" {}={:.2e}{}", e.name, e.max_rel, e.passed ? "" : "(FAIL)");
        EXPECT_TRUE(r.passed) << lay.str()
                              << " " << schedule::kind_name(kind) << (fuse ? " fused" : "")
                              << " [" << c.name
                              << "] routing " << (r.routing_matches ? "ok" : "DIFFERS")
                              << " dropped " << r.dropped_choices << ":" << detail;
        // S1 with nothing dropped also equals the whole (not per-slice) layer.
        if (kind == Kind::kS1 && (std::string(c.f) == "8.0" || std::string(c.f) == "none")) {
          o.whole_oracle = true;
          const LayerCheckResult w = check_layer(*topo, o);
          EXPECT_TRUE(w.passed) << "S1 vs the whole-layer oracle, " << lay.str();
        }
      }
    }
  }
  EXPECT_GT(checks, 0) << "no layouts in the sweep for world size " << test::world_size();
  EXPECT_GT(with_drops, 0);
  EXPECT_GT(without_drops, 0);
}

// --pad-to-capacity off (MoeShape::pad_to_capacity): the capacity-factor cases (drops, heavy
// drops, one expert overflowing while others get nothing) run on the packed exchanges of the
// kept rows, as dropless routing's; the same maths as padded: every schedule, fused and not,
// every layout, outputs and every gradient against the oracle.
TEST(Equivalence, UnpaddedCapacityEveryScheduleMatchesTheOracle) {
  int64_t checks = 0, with_drops = 0;
  for (const Layout3& lay : sweep_layouts(false)) {
    auto topo = topology_of(lay);
    const int64_t experts = test::world_size() == 3 ? 6 : 8;
    for (const Case& c : {kCases[1], kCases[2], kCases[3]})
      for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
        for (bool fuse : {false, true}) {
          if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
          LayerCheckOptions o = case_options(c, kind, fuse, experts, 8, 24);
          o.shape.pad_to_capacity = false;
          o.seed = 17;
          o.tolerance = kTolerance;
          const LayerCheckResult r = check_layer(*topo, o);
          ++checks;
          with_drops += r.dropped_choices > 0 ? 1 : 0;
          std::string detail;
          for (const auto& e : r.errors)
            detail += fmt::format(" {}={:.2e}{}", e.name, e.max_rel, e.passed ? "" : "(FAIL)");
          EXPECT_TRUE(r.passed) << lay.str() << " " << schedule::kind_name(kind)
                                << (fuse ? " fused" : "") << " [" << c.name
                                << ", unpadded] routing "
                                << (r.routing_matches ? "ok" : "DIFFERS") << " dropped "
                                << r.dropped_choices << ":" << detail;
        }
  }
  EXPECT_GT(checks, 0);
  EXPECT_GT(with_drops, 0);
}

// Every schedule (fused and not) on every layout of the sweep against the oracle, with and
// without drops, the options set by `set`; `extra`: an error entry that must be there.
template <class Set>
void expect_every_schedule_matches(Set set, const char* extra) {
  int64_t checks = 0;
  for (const Layout3& lay : sweep_layouts(false)) {
    auto topo = topology_of(lay);
    const int64_t experts = test::world_size() == 3 ? 6 : 8;
    for (const Case& c : {kCases[1], kCases[5]})
      for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
        for (bool fuse : {false, true}) {
          if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
          LayerCheckOptions o = case_options(c, kind, fuse, experts, 8, 24);
          o.seed = 13;
          o.tolerance = kTolerance;
          set(o);
          const LayerCheckResult r = check_layer(*topo, o);
          ++checks;
          bool has_extra = extra == nullptr;
          std::string detail;
          for (const auto& e : r.errors) {
            has_extra = has_extra || e.name == extra;
            detail += fmt::format(" {}={:.2e}{}", e.name, e.max_rel, e.passed ? "" : "(FAIL)");
          }
          EXPECT_TRUE(has_extra) << extra;
          EXPECT_TRUE(r.passed) << lay.str() << " " << schedule::kind_name(kind)
                                << (fuse ? " fused" : "") << " [" << c.name << "] routing "
                                << (r.routing_matches ? "ok" : "DIFFERS") << ":" << detail;
        }
  }
  EXPECT_GT(checks, 0);
}

// --router-z-loss: with a nonzero dl_z, l_z and the z-loss's gradients included.
TEST(Equivalence, RouterZLossEveryScheduleMatchesTheOracle) {
  expect_every_schedule_matches(
      [](LayerCheckOptions& o) {
        o.dl_aux = 0.0f;  // the gate's gradient is then the combine's and the z-loss's
        o.dl_z = 2.0f;
      },
      "l_z");
}

// --router-bias-update: a layer with a router bias routes (and computes) as the oracle
// given the same bias.
TEST(Equivalence, RouterBiasEveryScheduleMatchesTheOracle) {
  expect_every_schedule_matches(
      [](LayerCheckOptions& o) {
        o.router_bias.assign(static_cast<size_t>(o.shape.experts), 0.0f);
        for (size_t e = 0; e < o.router_bias.size(); ++e)
          o.router_bias[e] = 0.05f * static_cast<float>(e % 3) - 0.04f;
      },
      nullptr);
}

// The router options of docs/spec.md §7 (--router-score, --router-topk-norm, --router-scale,
// --router-groups / --router-group-topk), alone and together with the router bias and the
// z-loss: every schedule, fused and not, with drops and dropless, outputs and every
// gradient against the oracle given the same router.
TEST(Equivalence, RouterOptionsEveryScheduleMatchesTheOracle) {
  struct Opt {
    RouterSpec router;
    bool bias_and_z;
  };
  const int64_t E = test::world_size() == 3 ? 6 : 8;
  const int G = E == 6 ? 3 : 4;  // two experts per group
  for (const Opt& opt : {Opt{{RouterScore::kSigmoid}, false},
                         Opt{{RouterScore::kSoftmax, false, 2.5f}, false},
                         Opt{{RouterScore::kSoftmax, true, 1.0f, G, 2}, false},
                         Opt{{RouterScore::kSigmoid, true, 2.5f, G, 2}, true}}) {
    SCOPED_TRACE(MoeShape{}.str() + opt.router.str() + (opt.bias_and_z ? " bias z-loss" : ""));
    expect_every_schedule_matches(
        [&](LayerCheckOptions& o) {
          o.shape.router = opt.router;
          if (!opt.bias_and_z) return;
          o.dl_z = 2.0f;
          o.router_bias.assign(static_cast<size_t>(o.shape.experts), 0.0f);
          for (size_t e = 0; e < o.router_bias.size(); ++e)
            o.router_bias[e] = 0.05f * static_cast<float>(e % 3) - 0.04f;
        },
        nullptr);
  }
}

// --aux-loss sequence (docs/spec.md §7): l_aux the mean over the sequences of each one's, with
// sequences of T = 24 rows that straddle S1's MP slices of 12, 8 or 6 rows and that don't
// (L = 8 straddles at N_MP 2 and 4, L = 3 at N_MP 3); alone and with the sigmoid router's
// normalised l_aux and the z-loss: l_aux and every gradient against the oracle under every
// schedule, fused and not, dropping and dropless.
TEST(Equivalence, SequenceAuxLossEveryScheduleMatchesTheOracle) {
  for (const int64_t L : {3, 8})
    for (const bool sigmoid : {false, true}) {
      SCOPED_TRACE(fmt::format("aux_seq_len {}{}", L, sigmoid ? ", sigmoid router, z-loss" : ""));
      expect_every_schedule_matches(
          [&](LayerCheckOptions& o) {
            o.shape.aux_seq_len = L;
            o.dl_aux = 4.0f;
            if (!sigmoid) return;
            o.shape.router = {RouterScore::kSigmoid, true, 1.0f};
            o.dl_z = 2.0f;
          },
          "l_aux");
    }
}

// SwiGLU experts (docs/spec.md §8: W3 split along H like W1, no biases): every schedule, fused
// and not, with drops and dropless, outputs and every gradient (dW3 among them) against the
// oracle; alone and under DeepSeek-V3's router (sigmoid scores, groups, router bias, z-loss).
TEST(Equivalence, SwigluEveryScheduleMatchesTheOracle) {
  const int64_t E = test::world_size() == 3 ? 6 : 8;
  const int G = E == 6 ? 3 : 4;
  for (const bool deepseek : {false, true}) {
    SCOPED_TRACE(deepseek ? "swiglu, sigmoid router with groups, bias and z-loss" : "swiglu");
    expect_every_schedule_matches(
        [&](LayerCheckOptions& o) {
          o.shape.expert_mlp = ExpertMlp::kSwiglu;
          if (!deepseek) return;
          o.shape.router = {RouterScore::kSigmoid, true, 2.5f, G, 2};
          o.dl_z = 2.0f;
          o.router_bias.assign(static_cast<size_t>(o.shape.experts), 0.0f);
          for (size_t e = 0; e < o.router_bias.size(); ++e)
            o.router_bias[e] = 0.05f * static_cast<float>(e % 3) - 0.04f;
        },
        "dw3");
  }
}

// Shared experts (docs/spec.md §9: every token through N_s FFNs split over MP like the dense
// FFN, their sum times the shared gate): every schedule, fused and not, with drops and
// dropless, of either kind, gated and not, outputs and every gradient (the shared experts' and
// the shared gate's among them) against the oracle. Each MP rank holds H_s / N_MP columns, so
// an MP group computes each shared expert once.
TEST(Equivalence, SharedExpertsEveryScheduleMatchesTheOracle) {
  for (const ExpertMlp mlp : {ExpertMlp::kGelu, ExpertMlp::kSwiglu})
    for (const bool gate : {false, true}) {
      SCOPED_TRACE(fmt::format("{} shared experts, gate {}", expert_mlp_name(mlp), gate));
      expect_every_schedule_matches(
          [&](LayerCheckOptions& o) {
            o.shape.expert_mlp = mlp;
            o.shape.shared_experts = 2;
            o.shape.shared_hidden = 12;  // divisible by every CI layout's N_MP (1 to 4)
            o.shape.shared_gate = gate;
          },
          gate ? "dswg" : "dsw1");
    }
  for (const Layout3& lay : sweep_layouts(false)) {
    auto topo = topology_of(lay);
    auto s = MoeShape::of(24, 8, 24, test::world_size() == 3 ? 6 : 8, 2, "1.0");
    s.shared_experts = 2;
    s.shared_hidden = 12;
    MoeLayer layer(*topo, s, Kind::kS2);
    EXPECT_EQ(layer.params().shared.w1.dim(2) * topo->layout().mp, 12) << lay.str();
  }
}

// --shared-overlap (docs/spec.md §9): S1 and S2 compute the shared experts while the dispatch
// AllToAll is in flight, when there is one (ep > 1) and it is not fused; the passes then give
// the bits of the same passes run one step after another.
TEST(Equivalence, SharedOverlapIsBitIdenticalAndOnlyWhereThereIsAnAllToAll) {
  int64_t overlapped = 0;
  for (const Layout3& lay : sweep_layouts(false)) {
    auto topo = topology_of(lay);
    const int64_t E = test::world_size() == 3 ? 6 : 8;
    for (Kind kind : {Kind::kS1, Kind::kS2})
      for (bool fuse : {false, true}) {
        auto s = MoeShape::of(24, 8, 24, E, 2, "1.0");
        s.shared_experts = 2;
        s.shared_hidden = 12;
        s.shared_gate = true;
        std::vector<std::vector<float>> results[2];
        for (bool overlap : {false, true}) {
          s.shared_overlap = overlap;
          MoeLayer layer(*topo, s, kind, fuse);
          layer.load_whole(ref::init_params<float>(s, 5));
          layer.zero_grad();
          const auto x = check_input(s, 5, 0);
          const auto dout = check_dout(s, 5, 0);
          const Tensor out =
              layer.forward(Tensor::view(const_cast<float*>(x.data()), {s.tokens, s.model_dim}))
                  .clone();
          const Tensor dx = layer
                                .backward(Tensor::view(const_cast<float*>(dout.data()),
                                                       {s.tokens, s.model_dim}),
                                          0.5f)
                                .clone();
          auto& r = results[overlap];
          const MoeLayerParams& g = layer.grads();
          for (const Tensor* t : std::initializer_list<const Tensor*>{
                   &out, &dx, &g.wg, &g.shared.w1, &g.shared.w2, &g.shared_gate, &g.experts.w1})
            r.emplace_back(t->data(), t->data() + t->numel());
          bool has = false;
          for (const auto& st : layer.schedule().steps) has = has || st.overlap_next;
          const bool want = overlap && topo->layout().ep > 1 &&
                            !(layer.schedule().fused && topo->layout().esp > 1);
          EXPECT_EQ(has, want) << lay.str() << " " << schedule::kind_name(kind)
                               << (fuse ? " fused" : "") << " overlap " << overlap;
          overlapped += has;
        }
        EXPECT_EQ(results[0], results[1]) << lay.str() << " " << schedule::kind_name(kind)
                                          << (fuse ? " fused" : "");
      }
  }
  if (test::world_size() >= 2) EXPECT_GT(overlapped, 0);
}

// --precision bf16 on the CPU: every schedule (fused and not) on every layout of the sweep,
// with a capacity factor and dropless (packed exchange layout: the bf16 experts read their
// rows at the segments' starts), within the bf16 tolerance; and the products really are
// bf16: the error is of bf16's rounding (~1e-3), far above what fp32 products leave (~1e-7).
TEST(Equivalence, Bf16EveryScheduleEveryLayoutWithinTheBf16Tolerance) {
  int64_t checks = 0;
  for (const Layout3& lay : sweep_layouts(false)) {  // the fp32 test runs the reversed order
    auto topo = topology_of(lay);
    const int64_t experts = test::world_size() == 3 ? 6 : 8;
    for (const Case& c : {kCases[1], kCases[3], kCases[5]}) {
      for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
      for (bool fuse : {false, true}) {
        if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
        // M, H not multiples of the bf16 kernel's 16 / 32 blocks.
        LayerCheckOptions o = case_options(c, kind, fuse, experts, 40, 72);
        o.seed = 13;
        o.precision = Precision::kBf16;
        o.tolerance = default_tolerance(Precision::kBf16);
        const LayerCheckResult r = check_layer(*topo, o);
        ++checks;
        std::string detail;
        double out_error = 0.0;
        for (const auto& e : r.errors) {
          detail += fmt::format(" {}={:.2e}{}", e.name, e.max_rel, e.passed ? "" : "(FAIL)");
          if (e.name == "out") out_error = e.max_rel;
        }
        const std::string where = fmt::format("{} {}{} [{}]:{}", lay.str(),
                                              schedule::kind_name(kind),
                                              fuse ? " fused" : "", c.name, detail);
        EXPECT_TRUE(r.passed) << where;
        EXPECT_GT(out_error, 1e-5) << where << ": no bf16 rounding in the output";
      }
    }
  }
  EXPECT_GT(checks, 0);
}

// --precision bf16 with swiglu experts and shared experts (docs/spec.md §8-9, the routed
// experts' bf16 products for both): every schedule, fused and not, on every layout of the
// sweep (mp, ep, esp > 1), with drops and dropless, outputs and every gradient (dW3, the
// shared experts' and the shared gate's among them) within the bf16 tolerance; the output's
// error is bf16's rounding, not fp32's.
TEST(Equivalence, Bf16SwigluAndSharedExpertsEveryScheduleWithinTheBf16Tolerance) {
  struct Variant {
    ExpertMlp mlp;
    int shared;
    bool gate;
    const char* extra;  // an error entry that must be there
  };
  const Variant variants[] = {{ExpertMlp::kSwiglu, 0, false, "dw3"},
                              {ExpertMlp::kGelu, 1, true, "dswg"},
                              {ExpertMlp::kSwiglu, 2, false, "dsw3"},
                              {ExpertMlp::kSwiglu, 1, true, "dswg"}};
  int64_t checks = 0;
  for (const Variant& v : variants) {
    const std::string what = fmt::format("bf16 {} experts, {} shared, gate {}",
                                         expert_mlp_name(v.mlp), v.shared, v.gate);
    for (const Layout3& lay : sweep_layouts(false)) {
      auto topo = topology_of(lay);
      const int64_t experts = test::world_size() == 3 ? 6 : 8;
      for (const Case& c : {kCases[1], kCases[5]})
        for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
          for (bool fuse : {false, true}) {
            if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
            // M, H, H_s not multiples of the bf16 kernel's 16 / 32 blocks; H_s / N_MP too.
            LayerCheckOptions o = case_options(c, kind, fuse, experts, 40, 72);
            o.seed = 17;
            o.precision = Precision::kBf16;
            o.tolerance = default_tolerance(Precision::kBf16);
            o.shape.expert_mlp = v.mlp;
            o.shape.shared_experts = v.shared;
            o.shape.shared_hidden = v.shared > 0 ? 36 : 0;
            o.shape.shared_gate = v.gate;
            const LayerCheckResult r = check_layer(*topo, o);
            ++checks;
            bool has_extra = false;
            double out_error = 0.0;
            std::string detail;
            for (const auto& e : r.errors) {
              has_extra = has_extra || e.name == v.extra;
              if (e.name == "out") out_error = e.max_rel;
              detail += fmt::format(" {}={:.2e}{}", e.name, e.max_rel, e.passed ? "" : "(FAIL)");
            }
            const std::string where =
                fmt::format("{}: {} {}{} [{}]:{}", what, lay.str(), schedule::kind_name(kind),
                            fuse ? " fused" : "", c.name, detail);
            EXPECT_TRUE(has_extra) << where << ": no " << v.extra;
            EXPECT_TRUE(r.passed) << where;
            EXPECT_GT(out_error, 1e-5) << where << ": no bf16 rounding in the output";
          }
    }
  }
  EXPECT_GT(checks, 0);
}

TEST(Equivalence, InvalidLayersAreRefusedBeforeAnyWork) {
  TopologyOptions topt;
  topt.ep = test::world_size();
  auto topo = Topology::create(topt);
  // E not divisible by N_EP (when N_EP > 1).
  const auto s = MoeShape::of(16, 8, 16, test::world_size() * 2 + 1, 1, "1.0");
  if (test::world_size() > 1) {
    try {
      MoeLayer layer(*topo, s, Kind::kS1);
      FAIL() << "E not divisible by N_EP accepted";
    } catch (const InvalidConfig& e) {
      EXPECT_NE(std::string(e.what()).find("not divisible by --ep"), std::string::npos)
          << e.what();
    }
  }
  const Layout l = make_layout(4, 2, 1, 4);
  MoeShape ok = s;
  ok.experts = 4;
  try {
    schedule::validate({ok, l, 0}, Kind::kBaseline);
    FAIL() << "baseline with N_ESP not in {1, N_MP} accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("use --schedule s1 or s2"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(schedule::validate({ok, l, 0}, Kind::kS2));
}

// Skews the routing towards expert 0: its gate column grows and so do the inputs, so that
// it takes most tokens and some experts none (skew 0: unchanged).
void skew_routing(float skew, const MoeShape& s, ref::MoeParams<float>& params,
                  std::vector<float>& x) {
  if (skew == 0.0f) return;
  for (int64_t m = 0; m < s.model_dim; ++m)
    params.wg[static_cast<size_t>(m * s.experts)] += skew / static_cast<float>(s.model_dim);
  for (float& v : x) v += skew;
}

// Fused collectives compute exactly what the unfused pairs compute: bit for bit, outputs and
// every gradient, over the suite's layouts, for chunk counts 1, 2 and more than rows; with a
// capacity factor and dropless (the fused pipelines over the routed rows), even and skewed.
TEST(Equivalence, FusedEqualsUnfusedBitForBit) {
  struct Routing {
    int topk;
    const char* f;
    float skew;
    bool padded = true;  // MoeShape::pad_to_capacity
  };
  int64_t fused_dropless = 0, fused_unpadded = 0;
  for (const Layout3& lay : sweep_layouts(false))
  for (const Routing& rt : {Routing{2, "1.1", 0.0f}, Routing{2, "none", 0.0f},
                            Routing{1, "none", 3.0f}, Routing{2, "1.0", 0.0f, false},
                            Routing{1, "1.25", 3.0f, false}}) {
    auto topo = topology_of(lay);
    auto s = MoeShape::of(24, 8, 24, test::world_size() == 3 ? 6 : 8, rt.topk, rt.f);
    s.pad_to_capacity = rt.padded;
    auto params = ref::init_params<float>(s, 5);
    const int group = group_coord(topo->layout(), Group::kMp, topo->world_rank()).index;
    auto x = check_input(s, 5, group);
    auto dout = check_dout(s, 5, group);
    skew_routing(rt.skew, s, params, x);
    const Tensor xt = Tensor::view(x.data(), {s.tokens, s.model_dim});
    const Tensor dt = Tensor::view(dout.data(), {s.tokens, s.model_dim});
    for (Kind kind : {Kind::kS1, Kind::kS2}) {
      MoeLayer plain(*topo, s, kind, false);
      plain.load_whole(params);
      plain.zero_grad();
      const Tensor out0 = plain.forward(xt).clone();
      const Tensor dx0 = plain.backward(dt, 0.5f).clone();
      for (int chunks : {1, 2, 1000}) {
        MoeLayer fused(*topo, s, kind, true, chunks);
        fused.load_whole(params);
        fused.zero_grad();
        const Tensor out1 = fused.forward(xt).clone();
        const Tensor dx1 = fused.backward(dt, 0.5f).clone();
        const std::string where = fmt::format(
            "{} {} f={}{} skew {} chunks {} ({})", lay.str(), schedule::kind_name(kind), rt.f,
            rt.padded ? "" : " unpadded", rt.skew, chunks,
            fused.schedule().fused ? "fused" : "nothing to fuse");
        if (fused.schedule().fused && s.capacity_factor.dropless) ++fused_dropless;
        if (fused.schedule().fused && !rt.padded) ++fused_unpadded;
        auto same = [](const Tensor& a, const Tensor& b) {
          return a.numel() == b.numel() &&
                 std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
        };
        EXPECT_TRUE(same(out0, out1)) << where << " out";
        EXPECT_TRUE(same(dx0, dx1)) << where << " dx";
        EXPECT_EQ(plain.l_aux(), fused.l_aux()) << where;
        EXPECT_TRUE(same(plain.grads().wg, fused.grads().wg)) << where << " dwg";
        EXPECT_TRUE(same(plain.grads().experts.w1, fused.grads().experts.w1)) << where << " dw1";
        EXPECT_TRUE(same(plain.grads().experts.b1, fused.grads().experts.b1)) << where << " db1";
        EXPECT_TRUE(same(plain.grads().experts.w2, fused.grads().experts.w2)) << where << " dw2";
        EXPECT_TRUE(same(plain.grads().experts.b2, fused.grads().experts.b2)) << where << " db2";
      }
    }
  }
  // Some layouts of every world size from 2 on fuse (two of ep, esp, mp above one).
  if (test::world_size() >= 2) EXPECT_GT(fused_dropless, 0);
  if (test::world_size() >= 2) EXPECT_GT(fused_unpadded, 0);
}

// ---- bytes: docs/spec.md §3's table, in elements; N = N_MP = N_ESP ------------------------------

using Bytes = std::map<std::string, double>;

struct Volumes {
  Bytes forward, backward;
};

// z_loss: the layer runs the router z-loss, whose statistic travels beside docs/spec.md §3's 2E.
Volumes spec_volumes(Kind kind, const MoeShape& s, const Layout& l, bool z_loss) {
  const double E = s.experts, M = s.model_dim, T = s.tokens, N = l.mp, nep = l.ep;
  const double C = capacity(s.topk, s.capacity_factor, s.tokens, s.experts);
  const double C1 = capacity(s.topk, s.capacity_factor, s.tokens / l.mp, s.experts);
  const double Cs = std::ceil(C / N);
  const double f = 4.0;  // bytes per fp32 element
  const bool esp_rows = l.esp > 1;
  Volumes v;
  auto both = [&](const std::string& k, double elems) {
    if (elems == 0) return;
    v.forward[k] += elems * f;
    v.backward[k] += elems * f;
  };
  // Not in docs/spec.md §3's table: the fill counts that travel with the dispatch (one int32 per expert
  // segment, forward only), counted apart as "metadata" so the table's rows stay exact.
  const bool shared_esp_input = kind == Kind::kBaseline && l.esp == l.mp && l.mp > 1;
  if (nep > 1) v.forward["ep.metadata"] = (nep - 1) * (E / nep) * 4.0;
  if (esp_rows && !shared_esp_input) v.forward["esp.metadata"] = (l.esp - 1) * E * 4.0;
  // Shared experts (docs/spec.md §9): the shared gate's M weights ride with dWg's M E.
  const double gate_weights = M * E + (s.shared_gate ? M : 0);
  if (s.has_shared() && N > 1) {
    if (kind == Kind::kS1) {  // the slice gathered, the parts reduce-scattered; adjoints alike
      both("mp.allgather", (N - 1) * (T / N) * M);
      both("mp.reduce_scatter", (N - 1) * (T / N) * M);
    } else {  // Megatron's f and g: the input's gradient and the output summed over mp
      both("mp.allreduce", 2 * (N - 1) / N * T * M);
      if (s.shared_gate) v.backward["mp.allreduce"] += 2 * (N - 1) / N * gate_weights * f;
    }
  }
  if (shared_esp_input) {
    both("ep.alltoall", 2 * E * C * M * (nep - 1) / nep);
    both("esp.allreduce", 2 * (N - 1) / N * E * C * M);
  } else if (kind == Kind::kS1) {
    // The statistics: docs/spec.md §3's 2E numbers [and the router z-loss's sum of lse^2 beside them].
    if (N > 1) v.forward["mp.allreduce"] = 2 * (N - 1) / N * (2 * E + (z_loss ? 1 : 0)) * f;
    if (N > 1) v.backward["mp.allreduce"] = 2 * (N - 1) / N * gate_weights * f;
    both("ep.alltoall", 2 * E * C1 * M * (nep - 1) / nep);
    if (esp_rows) both("esp.allgather", (N - 1) * E * C1 * M);
    if (esp_rows) both("esp.reduce_scatter", (N - 1) * E * C1 * M);
    both("mp.allgather", (N - 1) * (T / N) * M);
  } else {  // S2, and the baseline with N_ESP = 1 < N_MP
    both("ep.alltoall", 2 * E * Cs * M * (nep - 1) / nep);
    if (esp_rows) both("esp.allgather", (N - 1) * E * Cs * M);
    if (esp_rows) both("esp.reduce_scatter", (N - 1) * E * Cs * M);
    both("mp.allgather", (N - 1) * E * Cs * M);
  }
  return v;
}

Bytes counted(Topology& topo) {
  Bytes b;
  for (Group g : {Group::kMp, Group::kEp, Group::kEsp, Group::kDp, Group::kEdp, Group::kWorld})
    for (int op = 0; op < kNumCommOps; ++op) {
      const OpStats& s = topo.comm(g).stats().op(static_cast<CommOp>(op));
      if (s.bus_bytes > 0)
        b[std::string(group_name(g)) + "." + comm_op_name(static_cast<CommOp>(op))] += s.bus_bytes;
    }
  return b;
}

std::string show(const Bytes& b) {
  std::string s;
  for (const auto& [k, v] : b) s += fmt::format(" {}={}", k, v);
  return s;
}

TEST(Bytes, CountedBytesMatchSpecTable) {
  std::vector<Layout3> layouts;
  switch (test::world_size()) {
    case 2: layouts = {{2, 1, 2}, {2, 1, 2, 1, kReversedOrder}}; break;
    case 4:
      layouts = {{2, 2, 2}, {2, 2, 1}, {4, 1, 4}, {2, 2, 2, 1, kReversedOrder},
                 {2, 2, 2, 1, kEspApartOrder},
                 {2, 2, 1, 1, "mp-dp-ep"}};  // MP inside a node, EP across nodes
      break;
    case 8: layouts = {{2, 4, 2}, {4, 2, 4}, {2, 4, 2, 1, kReversedOrder}}; break;
    default: GTEST_SKIP() << "byte layouts are defined for 2, 4 and 8 ranks";
  }
  for (const Layout3& lay : layouts) {
    auto topo = topology_of(lay);
    auto s = MoeShape::of(40, 8, 16, 8, 2, "1.1");  // C not divisible by N: Cp pads
    // The experts' kind changes no byte: swiglu's rows in and out are M wide (§8). Shared
    // experts (§9) add their MP collectives.
    struct Kinds {
      ExpertMlp mlp;
      int shared;
      bool gate;
    };
    for (const Kinds ks : {Kinds{ExpertMlp::kGelu, 0, false}, Kinds{ExpertMlp::kSwiglu, 0, false},
                           Kinds{ExpertMlp::kGelu, 2, false}, Kinds{ExpertMlp::kSwiglu, 1, true}})
    for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
    for (bool fuse : {false, true})
    for (bool z_loss : {false, true}) {
      if (!allowed(kind, lay)) continue;
      const ExpertMlp mlp = ks.mlp;
      s.expert_mlp = mlp;
      s.shared_experts = ks.shared;
      s.shared_hidden = ks.shared > 0 ? 16 : 0;
      s.shared_gate = ks.gate;
      MoeLayer layer(*topo, s, kind, fuse, 3, Precision::kFp32, z_loss);
      layer.load_whole(ref::init_params<float>(s, 3));
      const auto x = check_input(s, 3, 0);
      const auto dout = check_dout(s, 3, 0);
      topo->reset_stats();
      layer.forward(Tensor::view(const_cast<float*>(x.data()), {s.tokens, s.model_dim}));
      const Bytes fwd = counted(*topo);
      topo->reset_stats();
      layer.backward(Tensor::view(const_cast<float*>(dout.data()), {s.tokens, s.model_dim}),
                     0.5f, z_loss ? 0.25f : 0.0f);
      const Bytes bwd = counted(*topo);
      const Volumes want = spec_volumes(kind, s, topo->layout(), z_loss);
      const std::string where =
          fmt::format("{} {}{}{} {} {}", lay.str(), schedule::kind_name(kind),
                      fuse ? " fused" : "", z_loss ? " z-loss" : "", expert_mlp_name(mlp),
                      s.str());
      // The step list itself predicts what the communicator counts.
      for (bool backward : {false, true}) {
        Bytes listed;
        for (const auto& step : layer.schedule().steps)
          for (const auto& part :
               schedule::collective_parts(layer.schedule(), step, topo->layout(), backward))
            listed[std::string(group_name(part.group)) + "." + comm_op_name(part.op)] +=
                part.bus_bytes;
        EXPECT_EQ(listed, backward ? bwd : fwd) << where << (backward ? " backward" : " forward")
                                                << " listed:" << show(listed);
      }
      EXPECT_EQ(fwd.size(), want.forward.size())
          << where << " forward counted:" << show(fwd) << " spec:" << show(want.forward);
      for (const auto& [k, v] : want.forward)
        EXPECT_NEAR(fwd.count(k) ? fwd.at(k) : -1, v, 1e-6 * v) << where << " forward " << k;
      EXPECT_EQ(bwd.size(), want.backward.size())
          << where << " backward counted:" << show(bwd) << " spec:" << show(want.backward);
      for (const auto& [k, v] : want.backward)
        EXPECT_NEAR(bwd.count(k) ? bwd.at(k) : -1, v, 1e-6 * v) << where << " backward " << k;
    }
  }
}


// ---- dropless bytes: docs/dropless.md's formulas of the routed counts ----------------------

namespace dropless {

// D[r][e]: rows for expert e in world rank r's dispatch exchange: the routed choices n_e of
// its gate call (S1: its token slice; baseline, S2: the MP group's T), for S2 MP rank j's
// share floor((j+1) n_e / N_MP) - floor(j n_e / N_MP) of them. Computed from the routing (not from the layer's counts).
std::vector<std::vector<double>> dispatch_rows(Topology& topo, MoeLayer& layer) {
  const auto& sc = layer.schedule();
  const auto& r = layer.routing();
  const int64_t E = layer.shape().experts;
  std::vector<double> mine(static_cast<size_t>(E), 0.0);
  for (size_t i = 0; i < r.expert.size(); ++i)
    if (r.row[i] >= 0) mine[static_cast<size_t>(r.expert[i])] += 1.0;
  if (sc.exchange_slots < sc.dispatch_slots) {  // S2 (and its baseline form): my share
    const int64_t j = topo.comm(Group::kMp).rank(), n = topo.comm(Group::kMp).size();
    for (double& v : mine)
      v = static_cast<double>((static_cast<int64_t>(v) * (j + 1)) / n -
                              (static_cast<int64_t>(v) * j) / n);
  }
  Communicator& world = topo.host_comm(Group::kWorld);
  std::vector<double> all(mine.size() * static_cast<size_t>(world.size()));
  world.allgather(mine.data(), all.data(), mine.size());
  std::vector<std::vector<double>> d(static_cast<size_t>(world.size()));
  for (size_t w = 0; w < d.size(); ++w)
    d[w].assign(all.begin() + static_cast<ptrdiff_t>(w * mine.size()),
                all.begin() + static_cast<ptrdiff_t>((w + 1) * mine.size()));
  return d;
}

// The bytes of one pass (forward and backward move the same amounts, docs/dropless.md).
Bytes formula_bytes(Kind kind, const MoeShape& s, const Layout& l, int me,
                    const std::vector<std::vector<double>>& D) {
  const double M = s.model_dim, f = 4.0;
  const int64_t e_loc = s.experts / l.ep;
  auto local = [&](int w) { return group_coord(l, Group::kEp, w).rank * e_loc; };
  // R(w): routed rows world rank w's experts receive from its EP group.
  auto R = [&](int w) {
    double rows = 0;
    for (int p : group_members(l, Group::kEp, w))
      for (int64_t e = local(w); e < local(w) + e_loc; ++e) rows += D[p][e];
    return rows;
  };
  Bytes b;
  auto add = [&](const std::string& k, double rows) {
    if (rows > 0) b[k] += rows * M * f;
  };
  if (l.ep > 1) {
    double rows = R(me);
    for (int64_t e = local(me); e < local(me) + e_loc; ++e) rows -= D[me][e];  // self-copy
    for (int64_t e = 0; e < s.experts; ++e)
      if (e < local(me) || e >= local(me) + e_loc) rows += D[me][e];
    add("ep.alltoallv", rows);
  }
  const bool shared_esp_input = kind == Kind::kBaseline && l.esp == l.mp && l.mp > 1;
  if (l.esp > 1) {
    if (shared_esp_input) {
      // Reduce-scatter + allgather: ESP rank j sums rows [j R / n, (j + 1) R / n).
      const auto n = static_cast<int64_t>(l.esp), R_me = static_cast<int64_t>(R(me));
      const int64_t j = group_coord(l, Group::kEsp, me).rank;
      add("esp.allreduce", static_cast<double>(R_me + (n - 2) * ((j + 1) * R_me / n - j * R_me / n)));
    } else {
      double others = 0;
      for (int q : group_members(l, Group::kEsp, me))
        if (q != me) others += R(q);
      add("esp.allgather", others);
      add("esp.reduce_scatter", (l.esp - 1) * R(me));
    }
  }
  const bool s2_form = kind == Kind::kS2 || (kind == Kind::kBaseline && l.esp == 1);
  if (l.mp > 1 && s2_form) {
    double others = 0;
    for (int q : group_members(l, Group::kMp, me))
      if (q != me)
        for (double v : D[q]) others += v;
    add("mp.allgather", others);
  }
  if (l.mp > 1 && !s2_form && !shared_esp_input)  // S1: token slices
    add("mp.allgather", (l.mp - 1) * (s.tokens / l.mp));
  return b;
}

}  // namespace dropless

// Dropless, and a capacity factor without padding (--pad-to-capacity off): every exchange
// carries exactly the routed (kept) rows. The counted bytes equal the formulas of
// docs/dropless.md evaluated on the routing, for even and skewed routing, and the skewed case
// really is skewed (dropless: some expert gets nothing, the busiest more than 2x the mean;
// unpadded at f 1.0: choices were dropped).
TEST(Bytes, PackedCountedBytesMatchTheRoutedCountFormulas) {
  std::vector<Layout3> layouts;
  switch (test::world_size()) {
    case 1: layouts = {{1, 1, 1}}; break;
    case 2: layouts = {{2, 1, 2}, {1, 2, 1}}; break;
    case 4: layouts = {{2, 2, 2}, {2, 2, 1}, {4, 1, 4}, {1, 2, 2}}; break;
    case 8: layouts = {{2, 4, 2}, {4, 2, 4}}; break;
    default: GTEST_SKIP() << "dropless byte layouts are defined for 1, 2, 4 and 8 ranks";
  }
  int64_t skewed_checked = 0, fused_checked = 0, unpadded_dropped = 0;
  for (const Layout3& lay : layouts) {
    auto topo = test::make_topology(lay.mp, lay.ep, lay.esp);
    for (const char* f : {"none", "1.0"})
    for (float skew : {0.0f, 3.0f}) {
      auto s = MoeShape::of(40, 8, 16, 8, 2, f);
      s.pad_to_capacity = false;
      for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
      for (bool fuse : {false, true}) {
        if (!allowed(kind, lay) || (fuse && kind == Kind::kBaseline)) continue;
        MoeLayer layer(*topo, s, kind, fuse, 3);
        auto params = ref::init_params<float>(s, 3);
        auto x = check_input(s, 3, 0);
        skew_routing(skew, s, params, x);
        layer.load_whole(params);
        const auto dout = check_dout(s, 3, 0);
        topo->reset_stats();
        layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim}));
        Bytes fwd = counted(*topo);
        topo->reset_stats();
        layer.backward(Tensor::view(const_cast<float*>(dout.data()), {s.tokens, s.model_dim}),
                       0.5f);
        Bytes bwd = counted(*topo);
        const auto D = dropless::dispatch_rows(*topo, layer);
        Bytes want = dropless::formula_bytes(kind, s, topo->layout(), topo->world_rank(), D);
        const Layout& l = topo->layout();
        // Unchanged by dropless: the fill counts (forward), S1's statistics and dWg sums.
        Bytes want_fwd = want, want_bwd = want;
        const bool shared = kind == Kind::kBaseline && l.esp == l.mp && l.mp > 1;
        if (l.ep > 1) want_fwd["ep.metadata"] = (l.ep - 1) * (s.experts / l.ep) * 4.0;
        if (l.esp > 1 && !shared) want_fwd["esp.metadata"] = (l.esp - 1) * s.experts * 4.0;
        const double N = l.mp;
        if (kind == Kind::kS1 && l.mp > 1) {
          want_fwd["mp.allreduce"] = 2 * (N - 1) / N * (2 * s.experts) * 4.0;  // docs/spec.md §3's 2E
          want_bwd["mp.allreduce"] = 2 * (N - 1) / N * s.model_dim * s.experts * 4.0;
        }
        const std::string where =
            fmt::format("mp={} ep={} esp={} {}{} f={} skew {}", lay.mp, lay.ep, lay.esp,
                        schedule::kind_name(kind), layer.schedule().fused ? " fused" : "", f, skew);
        if (layer.schedule().fused) ++fused_checked;
        EXPECT_EQ(fwd, want_fwd) << where << " forward counted:" << show(fwd)
                                 << " formulas:" << show(want_fwd);
        EXPECT_EQ(bwd, want_bwd) << where << " backward counted:" << show(bwd)
                                 << " formulas:" << show(want_bwd);
        if (!s.capacity_factor.dropless) {  // dropped choices anywhere (row -1)
          const auto& rt = layer.routing();
          double mine = 0;
          for (const int64_t row : rt.row) mine += row < 0 ? 1.0 : 0.0;
          Communicator& world = topo->host_comm(Group::kWorld);
          std::vector<double> all(static_cast<size_t>(world.size()));
          world.allgather(&mine, all.data(), 1);
          unpadded_dropped += std::accumulate(all.begin(), all.end(), 0.0) > 0 ? 1 : 0;
        }
        if (skew > 0 && s.capacity_factor.dropless) {
          std::vector<double> per_expert(static_cast<size_t>(s.experts), 0.0);
          for (const auto& d : D)
            for (size_t e = 0; e < d.size(); ++e) per_expert[e] += d[e];
          const double total = std::accumulate(per_expert.begin(), per_expert.end(), 0.0);
          const double mx = *std::max_element(per_expert.begin(), per_expert.end());
          const double mn = *std::min_element(per_expert.begin(), per_expert.end());
          EXPECT_EQ(mn, 0.0) << where << ": no expert is left empty";
          EXPECT_GT(mx, 2.0 * total / s.experts) << where << ": routing is not skewed";
          ++skewed_checked;
        }
      }
    }
  }
  EXPECT_GT(skewed_checked, 0);
  EXPECT_GT(unpadded_dropped, 0);
  if (test::world_size() >= 4) EXPECT_GT(fused_checked, 0);
}

}  // namespace
}  // namespace parm
