// The inference path of `parm generate` (model/kv_decoder.h): its full forward is the training
// model's (the same loss on the same batch, GPT-2 and BERT, gelu and swiglu experts, shared
// experts), its KV-cached logits equal its full forward's, and sampling is a deterministic
// function of the logits and the uniform draw. One process (world size 1).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "model/kv_decoder.h"
#include "model_test_util.h"
#include "mpi_test_util.h"

namespace parm::model {
namespace {

using namespace test_util;

// The weights of a freshly built single-process model, whole, by name.
std::map<std::string, Tensor> weights_of(Model& m) {
  std::map<std::string, Tensor> w;
  for (Param* p : m.params()) w.emplace(p->name, p->value.clone());
  return w;
}

// Sum over rows with a target of -log softmax(logits row)[target], in double.
double loss_of(const std::vector<float>& logits, const std::vector<int32_t>& targets,
               int64_t V) {
  double sum = 0.0;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] < 0) continue;
    const float* x = logits.data() + static_cast<int64_t>(r) * V;
    double mx = x[0];
    for (int64_t c = 1; c < V; ++c) mx = std::max(mx, static_cast<double>(x[c]));
    double z = 0.0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(x[c] - mx);
    sum += std::log(z) + mx - x[targets[r]];
  }
  return sum;
}

TEST(KvDecoder, FullForwardIsTheTrainingModel) {
  if (test::world_size() != 1) GTEST_SKIP() << "runs at 1 rank";
  for (const auto& [arch, mlp, shared] : {std::tuple{Arch::kGpt2, ExpertMlp::kGelu, 0},
                                          std::tuple{Arch::kBert, ExpertMlp::kGelu, 0},
                                          std::tuple{Arch::kGpt2, ExpertMlp::kSwiglu, 2}}) {
    const ModelConfig c = tiny_config(arch, mlp, shared);  // f = E: the model drops nothing
    auto m = make_model(self_topology(), c, {}, 1);
    const Batch full = make_batch(arch, 0);  // sequence 0 of it
    Batch b;
    b.batch = 1;
    b.seq_len = c.seq_len;
    b.tokens.assign(full.tokens.begin(), full.tokens.begin() + c.seq_len);
    b.targets.assign(full.targets.begin(), full.targets.begin() + c.seq_len);
    if (arch == Arch::kBert) b.targets[1] = b.tokens[1] = 65;  // at least one target
    const double want = m->forward(b).lm_loss_sum;
    KvDecoder dec(c, weights_of(*m));
    const double got = loss_of(dec.forward(b.tokens), b.targets, c.vocab);
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want))
        << (arch == Arch::kGpt2 ? "gpt2 " : "bert ") << expert_mlp_name(mlp) << " shared "
        << shared;
  }
}

TEST(KvDecoder, CachedLogitsEqualTheFullForward) {
  if (test::world_size() != 1) GTEST_SKIP() << "runs at 1 rank";
  const ModelConfig c = tiny_config(Arch::kGpt2, ExpertMlp::kGelu, 2);
  auto m = make_model(self_topology(), c, {}, 1);
  std::vector<std::vector<float>> bias(2, std::vector<float>(static_cast<size_t>(c.experts)));
  for (size_t e = 0; e < bias[0].size(); ++e) bias[1][e] = 0.01f * static_cast<float>(e);
  KvDecoder dec(c, weights_of(*m), bias);
  const std::vector<int32_t> tokens = {72, 101, 108, 108, 111, 32, 119, 111};
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), c.seq_len);
  const std::vector<float> full = dec.forward(tokens);
  EXPECT_EQ(dec.length(), c.seq_len);
  dec.reset();
  // A prompt of 3, then one token at a time.
  std::vector<float> cached = dec.append({tokens.begin(), tokens.begin() + 3});
  for (size_t t = 3; t < tokens.size(); ++t) {
    const std::vector<float> row = dec.append({tokens[t]});
    cached.insert(cached.end(), row.begin(), row.end());
  }
  ASSERT_EQ(cached.size(), full.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < full.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(cached[i]) - full[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(full[i])));
  }
  EXPECT_LE(err / scale, 1e-5) << "max |cached - full| " << err << " of " << scale;
  EXPECT_THROW(dec.append({1}), Error);  // the cache is full: seq_len positions
}

TEST(KvDecoder, SamplingIsAFunctionOfTheLogitsAndTheDraw) {
  if (test::world_size() != 1) GTEST_SKIP() << "runs at 1 rank";
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  EXPECT_EQ(sample_token(logits.data(), 5, 0.0, 0, 0.99), 1);  // largest, ties to the lower
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 1, 0.99), 1);  // top-1 is greedy
  // top-2 at temperature 1: ids 1 and 2 with probability 1/2 each.
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 2, 0.49), 1);
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 2, 0.51), 2);
  // Over all five, u near 1 lands on the least likely (id 3, last in the order).
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 0, 0.999999), 3);
  int counts[5] = {};
  for (int i = 0; i < 1000; ++i)
    ++counts[sample_token(logits.data(), 5, 1.0, 0, (i + 0.5) / 1000.0)];
  // p = softmax(logits): 0.0845, 0.3787, 0.3787, 0.0189, 0.1393.
  EXPECT_NEAR(counts[1], 379, 2);
  EXPECT_NEAR(counts[2], 379, 2);
  EXPECT_NEAR(counts[3], 19, 2);
  EXPECT_THROW(sample_token(logits.data(), 5, -1.0, 0, 0.5), Error);
}

}  // namespace
}  // namespace parm::model
