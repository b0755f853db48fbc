// Gate, routing and the l_aux statistics (docs/spec.md §2 items 1-3 and 7).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "kernels/math/moe_math.h"
#include "shape/packed_rows.h"
#include "moe/expert_products.h"
#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe {

namespace {

// Group-limited selection (docs/spec.md §7) on one token's selection scores sc (E): the
// experts outside the K_g groups of largest score (the sum of a group's two largest scores,
// its one when a group holds one expert; ties to the lower group) get -inf.
void limit_groups(float* sc, int64_t E, const RouterSpec& rs) {
  const int64_t G = rs.groups, per = E / G;
  float gscore[kMaxRouterGroups];
  for (int64_t g = 0; g < G; ++g) {
    float a = -INFINITY, b = -INFINITY;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (sc[e] > a) {
        b = a;
        a = sc[e];
      } else if (sc[e] > b) {
        b = sc[e];
      }
    }
    gscore[g] = per == 1 ? a : a + b;
  }
  bool kept[kMaxRouterGroups] = {};
  for (int i = 0; i < rs.group_topk; ++i) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
    kept[best] = true;
  }
  for (int64_t e = 0; e < E; ++e)
    if (!kept[e / per]) sc[e] = -INFINITY;
}

}  // namespace

void gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity, int64_t slots,
                  Tensor& probs, GateRouting& r, float* stats, PhaseTimes* times,
                  const float* bias, const RouterSpec& router, const AuxRows& aux_rows,
                  int64_t sets, bool z_loss) {
  PhaseClock clock(times);
  const int64_t rows = x.rows(), M = x.cols(), E = wg.cols();
  PARM_CHECK_EQ(wg.rows(), M);
  PARM_CHECK(probs.rows() == rows && probs.cols() == E, "probs {} for {} rows x {} experts",
             shape_str(probs.shape()), rows, E);
  PARM_CHECK(topk >= 1 && topk <= E, "top-k {} with {} experts", topk, E);
  PARM_CHECK(slots >= capacity, "dispatch slots {} below capacity {}", slots, capacity);
  PARM_CHECK(sets >= 1 && (rows == 0 || aux_rows.set_of(rows - 1) < sets),
             "gate rows [{}, {}) in sequences of {}: beyond the {} statistics sets",
             aux_rows.first, aux_rows.first + rows, aux_rows.seq_len, sets);
  cpu::gemm(false, false, rows, E, M, x.data(), wg.data(), probs.data(), false, kLayerGemm);
  clock.lap("gate products");
  // The z-loss's log-sum-exp of each row's logits, read before the softmax overwrites them.
  r.lse.resize(z_loss ? static_cast<size_t>(rows) : 0);
  double zsum = 0.0;
  for (int64_t t = 0; z_loss && t < rows; ++t) {
    const float* l = probs.row(t);
    const float mx = *std::max_element(l, l + E);
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(static_cast<double>(l[e] - mx));
    const double lse = mx + std::log(s);
    r.lse[static_cast<size_t>(t)] = static_cast<float>(lse);
    zsum += lse * lse;
  }
  const bool sigmoid = router.score == RouterScore::kSigmoid;
  PARM_CHECK(router.groups <= kMaxRouterGroups, "{} router groups", router.groups);
  r.router = router;
  if (sigmoid) {
    // Scores s = sigmoid(logit); the z-loss's backward needs the logits' softmax, so the
    // logits are kept (with the z-loss only).
    if (z_loss)
      r.logits.assign(probs.data(), probs.data() + rows * E);
    else
      r.logits.clear();
    for (int64_t i = 0; i < rows * E; ++i)
      probs.data()[i] = 1.0f / (1.0f + std::exp(-probs.data()[i]));
  } else {
    cpu::softmax_forward(probs.data(), probs.data(), rows, E);
  }
  clock.lap("softmax");

  r.tokens = rows;
  r.experts = E;
  r.topk = topk;
  r.capacity = capacity;
  r.slots = slots;
  const size_t n = static_cast<size_t>(rows * topk);
  r.expert.resize(n);
  r.prob.resize(n);
  r.weight.resize(n);
  r.row.resize(n);
  r.fill.assign(static_cast<size_t>(E), 0);
  r.first.clear();  // rows e * slots + slot until pack_routing (capacity kept)
  if (bias == nullptr && !router.group_limited()) {
    cpu::topk(probs.data(), rows, E, topk, r.expert.data(), r.prob.data());
  } else {
    // The selection scores: the scores plus the router bias, out of the closed groups.
    r.scores.resize(static_cast<size_t>(rows * E));
    for (int64_t t = 0; t < rows; ++t) {
      float* sc = &r.scores[static_cast<size_t>(t * E)];
      for (int64_t e = 0; e < E; ++e) sc[e] = bias ? probs.row(t)[e] + bias[e] : probs.row(t)[e];
      if (router.group_limited()) limit_groups(sc, E, router);
    }
    cpu::topk(r.scores.data(), rows, E, topk, r.expert.data(), r.prob.data());
    for (size_t i = 0; i < n; ++i)
      r.prob[i] = probs.row(static_cast<int64_t>(i) / topk)[r.expert[i]];
  }
  clock.lap("top-k");
  for (int64_t t = 0; t < rows; ++t) {
    const size_t base = static_cast<size_t>(t * topk);
    math::combine_weights(&r.prob[base], topk, &r.weight[base], router.topk_norm, router.scale);
  }
  // GShard priority: all 1st choices in token order, then all 2nd choices, ...
  for (int64_t pos = 0; pos < rows * topk; ++pos) {
    const auto i = static_cast<size_t>(math::priority_choice(pos, rows, topk));
    const int64_t e = r.expert[i];
    int64_t& f = r.fill[static_cast<size_t>(e)];
    r.row[i] = math::slot_row(e, f, capacity, slots);
    if (f < capacity) ++f;
  }
  r.aux_rows = aux_rows;
  r.aux_sets = sets;
  std::fill(stats, stats + 2 * E * sets, 0.0f);
  stats[2 * E * sets] = static_cast<float>(zsum);
  r.score_sum.resize(sigmoid ? static_cast<size_t>(rows) : 0);
  for (int64_t t = 0; t < rows; ++t) {
    float* count = stats + 2 * E * aux_rows.set_of(t);
    float* psum = count + E;
    count[r.expert[static_cast<size_t>(t * topk)]] += 1.0f;
    const float* p = probs.row(t);
    if (sigmoid) {  // l_aux's p: the scores normalised to sum 1
      float z = 0.0f;
      for (int64_t e = 0; e < E; ++e) z += p[e];
      r.score_sum[static_cast<size_t>(t)] = z;
      for (int64_t e = 0; e < E; ++e) psum[e] += p[e] / z;
    } else {
      for (int64_t e = 0; e < E; ++e) psum[e] += p[e];
    }
  }
  clock.lap("slots + statistics");
}

void pack_routing(GateRouting& r) {
  r.first.resize(static_cast<size_t>(r.experts));
  packed_starts(r.fill.data(), r.experts, r.first.data());
  for (size_t i = 0; i < r.row.size(); ++i)
    if (r.row[i] >= 0) {
      const int64_t e = r.expert[i];
      r.row[i] = math::packed_row(static_cast<int32_t>(r.row[i]), e, r.slots,
                                  static_cast<int32_t>(r.first[static_cast<size_t>(e)]));
    }
}

void gate_backward(const Tensor& x, const Tensor& wg, const Tensor& probs, const GateRouting& r,
                   const std::vector<float>& dweight, const float* dstats, Tensor& dprobs,
                   Tensor& dwg, Tensor& dx, PhaseTimes* times) {
  PhaseClock clock(times);
  const int64_t rows = x.rows(), M = x.cols(), E = wg.cols();
  const int k = r.topk;
  const bool sigmoid = r.router.score == RouterScore::kSigmoid;
  std::vector<float> dbal(sigmoid ? static_cast<size_t>(E) : 0);
  for (int64_t t = 0; t < rows; ++t) {
    const size_t base = static_cast<size_t>(t * k);
    const float* dpsum = dstats + 2 * E * r.aux_rows.set_of(t) + E;
    const float* dp = dpsum;
    if (sigmoid) {
      // l_aux's p_e = s_e / z: ds_e = (dpsum_e - sum_i dpsum_i p_i) / z.
      const float z = r.score_sum[static_cast<size_t>(t)];
      const float* sv = probs.row(t);
      float dot = 0.0f;
      for (int64_t e = 0; e < E; ++e) dot += dpsum[e] * (sv[e] / z);
      for (int64_t e = 0; e < E; ++e) dbal[static_cast<size_t>(e)] = (dpsum[e] - dot) / z;
      dp = dbal.data();
    }
    math::weights_backward_row(&r.expert[base], &r.prob[base], &dweight[base], k, dp, E,
                               dprobs.row(t), r.router.topk_norm, r.router.scale);
  }
  clock.lap("top-k + weights backward");
  if (sigmoid) {
    for (int64_t i = 0; i < rows * E; ++i) {
      const float sv = probs.data()[i];
      dprobs.data()[i] *= sv * (1.0f - sv);
    }
  } else {
    cpu::softmax_backward(probs.data(), dprobs.data(), dprobs.data(), rows, E);
  }
  // z-loss: d(sum_t lse_t^2) / d logit[t, e] = 2 lse_t p[t, e], p the logits' softmax (the
  // scores, or under sigmoid exp(logit - lse)).
  if (const float dz = dstats[2 * E * r.aux_sets]; dz != 0.0f) {
    PARM_CHECK(static_cast<int64_t>(r.lse.size()) == rows,
               "a z-loss gradient ({}) for a gate call made without the z-loss", dz);
    for (int64_t t = 0; t < rows; ++t) {
      const float lse = r.lse[static_cast<size_t>(t)];
      const float c = 2.0f * dz * lse;
      const float* p = probs.row(t);
      float* dl = dprobs.row(t);
      if (sigmoid) {
        const float* l = &r.logits[static_cast<size_t>(t * E)];
        for (int64_t e = 0; e < E; ++e) dl[e] += c * std::exp(l[e] - lse);
      } else {
        for (int64_t e = 0; e < E; ++e) dl[e] += c * p[e];
      }
    }
  }
  clock.lap("softmax backward");
  cpu::gemm(true, false, M, E, rows, x.data(), dprobs.data(), dwg.data(), true, kLayerGemm);
  cpu::gemm(false, true, rows, M, E, dprobs.data(), wg.data(), dx.data(), true, kLayerGemm);
  clock.lap("gate products");
}

float aux_loss(const float* stats, int64_t E, int64_t total, int64_t sets) {
  if (total == 0) return 0.0f;
  const int64_t L = total / sets;
  double mean = 0.0;
  for (int64_t q = 0; q < sets; ++q) {
    const float* count = stats + 2 * E * q;
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e)
      sum += static_cast<double>(count[e]) / L * (static_cast<double>(count[E + e]) / L);
    mean += E * sum;
  }
  return static_cast<float>(mean / static_cast<double>(sets));
}

float z_loss(const float* stats, int64_t E, int64_t total, int64_t sets) {
  return total == 0 ? 0.0f
                    : static_cast<float>(static_cast<double>(stats[2 * E * sets]) / total);
}

void aux_loss_backward(const float* stats, int64_t E, int64_t total, float dl_aux, float dl_z,
                       float* dstats, int64_t sets) {
  dstats[2 * E * sets] =
      total == 0 ? 0.0f : static_cast<float>(static_cast<double>(dl_z) / total);
  const int64_t L = total / sets;
  // d/dpsum_se of (1/S) sum_s E sum_e (count_se / L)(psum_se / L).
  const double denom = static_cast<double>(sets) * static_cast<double>(L) * L;
  for (int64_t q = 0; q < sets; ++q)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t i = 2 * E * q + e;
      dstats[i] = 0.0f;
      dstats[i + E] = total == 0 ? 0.0f
                                 : static_cast<float>(static_cast<double>(dl_aux) * E *
                                                      stats[i] / denom);
    }
}

}  // namespace parm::moe
