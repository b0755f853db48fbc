// The shape of the multi-head self-attention core on one rank: the vocabulary that the
// model's CPU attention (model/blocks.h) and the device kernels (kernels/cuda/dense_kernels.h)
// share. Depends on nothing above include/parm.
#pragma once

#include <cstdint>

#include "parm/device.h"

namespace parm {

struct AttentionShape {
  int64_t batch = 0;     // B
  int64_t seq_len = 0;   // L
  int64_t heads = 0;     // heads held here (num_heads / N_MP)
  int64_t head_dim = 0;  // D = M / num_heads
  bool causal = false;   // GPT-2: position i attends to j <= i; BERT: to every j
  Precision precision = Precision::kFp32;  // of its four products (dense_gemm)
  int64_t width() const { return heads * head_dim; }  // columns of q, k, v, out
};

}  // namespace parm
