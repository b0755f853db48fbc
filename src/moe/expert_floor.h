// The floor of the layer's expert pass (bench-layer's "floor"): the products of every
// local expert (six for gelu experts, nine for swiglu ones, moe/expert_products.h), each on
// that expert's own operands (weights and rows, in the sizes and layouts the pass uses), run
// alone. The operands are made before the clock starts (packed
// to bf16 at Precision::kBf16), so the floor is the GEMMs alone.
//
// Every expert has its own operands because the layer's pass reads each expert's own: at the
// reference layer (M 512, Hl 2048, 4 local experts) 32 MB of packed bf16 weights, more than
// L2 and most of L3. A floor that ran every expert's products on one expert's operands would
// read them from cache and sit below what any implementation of the layer can reach.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_buffer.h"
#include "moe/expert_products.h"
#include "parm/device.h"

namespace parm::moe {

class ExpertProductsFloor {
 public:
  // The floor's inputs, one set per expert.
  enum Input { kX, kW1, kAct, kW2, kDy, kDPre, kW3, kDGate, kNumInputs };
  // Element i of expert e's input `which` (row-major: x, act, dy, dpre, dgate (rows[e], M or
  // Hl), W1 and W3 (M, Hl), W2 (Hl, M)): ordinary magnitudes (denormals or zeros could change
  // the rate), a different pattern for every expert and input.
  static float input(int64_t expert, Input which, int64_t i);

  // Allocates and fills every expert's operands and outputs (packed at Precision::kBf16).
  ExpertProductsFloor(std::vector<int64_t> rows, int64_t model_dim, int64_t hidden, Precision p,
                      ExpertMlp mlp = ExpertMlp::kGelu);
  // The products of every expert once, in the pass's order (dW1, dW2, dW3 and swiglu's
  // second dx product accumulate).
  void run();
  // One untimed run, then `reps` timed ones; the median (us).
  double time_us(int reps);
  // Expert e's output of product q (fp32, row-major, zero before the first run()).
  const float* output(int64_t e, ExpertProduct q) const;

 private:
  struct Expert {
    std::vector<float> in[kNumInputs];        // Precision::kFp32: the inputs, by Input
    cpu::Bf16Buffer xa, acta, dya, dprea;     // bf16: row operands packed as A
    cpu::Bf16Buffer xt, actt;                 // x^T, act^T packed as A (dW1, dW2)
    cpu::Bf16Buffer dyb, dpreb;               // dy, dpre packed as B (dW2, dW1)
    cpu::Bf16Buffer w1b, w2b, w2tb, w1tb;     // W1, W2, W2^T, W1^T packed as B
    cpu::Bf16Buffer w3b, w3tb, dgatea, dgateb;  // swiglu: W3, W3^T as B; dgate as A and B
    std::vector<float> out[kMaxExpertProducts];  // by ExpertProduct
  };
  void pack(int64_t e, Expert& x);
  std::vector<int64_t> rows_;
  int64_t model_dim_, hidden_;
  Precision precision_;
  ExpertMlp mlp_;
  std::vector<Expert> experts_;
};

}  // namespace parm::moe
