// Inference of a trained model in one process, from its whole tensors (what a checkpoint
// holds, whatever layout saved it): `parm generate` (tools/parm/cmd_generate.cpp).
//
// GPT-2: a KV cache. Each block keeps the keys and values (seq_len, M) of the positions seen
// so far; append() runs only the new positions, their queries attending to every cached key
// up to their own position, and returns their logits. A full forward is append() on an
// empty cache: the same arithmetic (tests/unit/test_kv_decoder.cpp checks the two equal).
// BERT: forward() runs the whole sequence both ways (no cache: every position sees every
// other).
//
// The maths is the training model's (model/transformer.h) at fp32 on the CPU, whole tensors,
// with one difference: the MoE layers route dropless (docs/spec.md §2 without a capacity,
// the reference layer src/moe/reference_moe.h), so that a token's output does not depend on
// the other tokens of its call and the cached and the full forward agree. With the router
// bias of the checkpoint (--router-bias-update) added for the choice, as in training.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"
#include "parm/tensor.h"

namespace parm::model {

class KvDecoder {
 public:
  // weights: every parameter of the model by name (ParamSpec::name), whole, on the host;
  // router_bias: per MoE block, E numbers, or empty (none). Throws parm::Error naming a
  // missing or misshapen tensor.
  KvDecoder(const ModelConfig& c, const std::map<std::string, Tensor>& weights,
            const std::vector<std::vector<float>>& router_bias = {});

  int64_t vocab() const { return c_.vocab; }
  int64_t max_positions() const { return c_.seq_len; }  // what the cache (wpe) holds
  int64_t length() const { return len_; }               // positions cached
  void reset() { len_ = 0; }

  // GPT-2: runs `tokens` at positions [length(), length() + n), caching their keys and
  // values; returns their logits (n, V). Throws when length() + n > max_positions().
  std::vector<float> append(const std::vector<int32_t>& tokens);
  // BERT: the logits (n, V) of a whole sequence (n <= max_positions()), every position
  // attending to every other. GPT-2: reset() then append(tokens).
  std::vector<float> forward(const std::vector<int32_t>& tokens);

 private:
  struct BlockWeights;
  // x (n, M) rows at positions [len_, len_ + n) through block i; `causal`: each row sees
  // keys up to its position (GPT-2), else all n (BERT, len_ = 0).
  void block(size_t i, std::vector<float>& x, int64_t n, bool causal);
  std::vector<float> head(const std::vector<float>& x, int64_t n) const;
  const float* w(const std::string& name, const Shape& shape) const;

  ModelConfig c_;
  std::map<std::string, Tensor> weights_;
  std::vector<std::vector<float>> router_bias_;
  std::vector<std::vector<float>> keys_, values_;  // per block (seq_len, M)
  int64_t len_ = 0;
};

// A token sampled from logits (V): temperature 0 takes the largest (ties: the lower id);
// else softmax(logits / temperature) over the top_k largest (0: all), drawn with u, a
// uniform number in [0, 1). Deterministic given u.
int32_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     double u);

}  // namespace parm::model
