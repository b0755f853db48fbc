// The tiny models, their micro-batches and the single-process reference that the model
// tests (test_model.cpp, test_pipeline.cpp) compare every layout against.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "model/model.h"
#include "mpi_test_util.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::model::test_util {

constexpr int64_t kMicroBatch = 3;  // B; T = B * L = 24 divides by N_MP in {1, 2, 3, 4, 8}

// mlp: the MoE blocks' experts (docs/spec.md §8); shared: shared experts of width 24 with the
// shared gate (docs/spec.md §9; 0: none).
inline ModelConfig tiny_config(Arch arch, ExpertMlp mlp = ExpertMlp::kGelu, int shared = 0) {
  const bool three = parm::test::world_size() == 3;
  ModelConfig c;
  c.arch = arch;
  c.vocab = arch == Arch::kBert ? kBertVocab : 256;
  c.seq_len = 8;
  c.num_heads = three ? 6 : 8;
  c.model_dim = 4 * c.num_heads;  // head dim 4
  c.num_layers = 4;
  c.moe_every = 2;  // blocks 1 and 3 are MoE, 0 and 2 dense
  c.ffn_hidden = three ? 48 : 64;
  c.experts = three ? 6 : 8;
  c.expert_hidden = three ? 24 : 32;
  c.topk = 2;
  c.capacity_factor = three ? "6.0" : "8.0";  // f = E: C >= T, nothing drops
  c.aux_loss_coeff = 0.1f;
  c.init_std = 0.2f;       // large enough that every nonlinearity matters
  c.init_bias_std = 0.1f;  // nonzero biases and LN shifts: a bias added twice shows
  c.seed = 42;
  c.expert_mlp = mlp;
  c.shared_experts = shared;
  c.shared_hidden = shared > 0 ? 24 : 0;  // divisible by N_MP = 1, 2, 3, 4
  c.shared_gate = shared > 0;
  return c;
}

// Micro-batch d of the global batch: random bytes; GPT-2 targets are the next byte, BERT
// masks about a quarter of the positions (input [MASK], target the original byte).
inline Batch make_batch(Arch arch, int d) {
  Batch b;
  b.batch = kMicroBatch;
  b.seq_len = 8;
  const int64_t T = b.batch * b.seq_len;
  Rng rng(1234, 100 + static_cast<uint64_t>(d));
  for (int64_t s = 0; s < b.batch; ++s) {
    std::vector<int32_t> seq(static_cast<size_t>(b.seq_len + 1));
    for (auto& t : seq) t = static_cast<int32_t>(rng.next_u32() % 256);
    for (int64_t l = 0; l < b.seq_len; ++l) {
      if (arch == Arch::kGpt2) {
        b.tokens.push_back(seq[static_cast<size_t>(l)]);
        b.targets.push_back(seq[static_cast<size_t>(l + 1)]);
      } else {
        const bool masked = rng.uniform() < 0.25f;
        b.tokens.push_back(masked ? kBertMaskToken : seq[static_cast<size_t>(l)]);
        b.targets.push_back(masked ? seq[static_cast<size_t>(l)] : -1);
      }
    }
  }
  PARM_CHECK_EQ(static_cast<int64_t>(b.tokens.size()), T);
  return b;
}

inline int64_t count_targets(const Batch& b) {
  return static_cast<int64_t>(
      std::count_if(b.targets.begin(), b.targets.end(), [](int32_t y) { return y >= 0; }));
}

inline Topology& self_topology() {
  static std::unique_ptr<Topology> topo = [] {
    TopologyOptions o;
    o.self_only = true;
    return Topology::create(o);
  }();
  return *topo;
}

// The job's topology for a pipeline layout (the default order).
inline std::unique_ptr<Topology> pipe_topology(int mp, int ep, int esp, int pp) {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  o.pp = pp;
  o.timeout_s = 120.0;
  return Topology::create(o);
}

// The single-process model over n_dp micro-batches with gradient accumulation.
struct Reference {
  double lm_loss_sum = 0.0;
  double aux_sum = 0.0;
  std::map<std::string, Tensor> value, grad;  // whole tensors by name
};

inline const Reference& reference(Arch arch, int n_dp, ExpertMlp mlp = ExpertMlp::kGelu,
                                  int shared = 0) {
  static std::map<std::tuple<int, int, int, int>, Reference> cache;
  const auto key = std::make_tuple(static_cast<int>(arch), n_dp, static_cast<int>(mlp), shared);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Reference r;
  auto model = make_model(self_topology(), tiny_config(arch, mlp, shared), {}, kMicroBatch);
  int64_t denom = 0;
  for (int d = 0; d < n_dp; ++d) denom += count_targets(make_batch(arch, d));
  for (int d = 0; d < n_dp; ++d) {
    const LossParts lp =
        model->forward_backward(
            make_batch(arch, d), {static_cast<double>(denom), static_cast<double>(n_dp)}, 1.0f);
    r.lm_loss_sum += lp.lm_loss_sum;
    r.aux_sum += lp.aux_loss;
  }
  for (Param* p : model->params()) {
    r.value[p->name] = p->value.clone();
    r.grad[p->name] = p->grad.clone();
  }
  return cache.emplace(key, std::move(r)).first->second;
}

inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(t[i])));
  return m;
}

// fp32 sums in a different order (partial sums over mp, grads summed over dp/edp instead of
// accumulated, all-reduce trees): errors are a few ulps of the tensor's largest entries; a
// missing or doubled contribution is of order 1 relative.
constexpr double kGradTol = 1e-4;
constexpr double kLossTol = 1e-5;


}  // namespace parm::model::test_util
