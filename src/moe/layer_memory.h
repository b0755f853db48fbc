// What one MoE layer holds, predicted from its schedule before it is built (model/
// memory_plan.h's dry run): the CPU layer's own tensors as MoeLayer::held_bytes() counts them.
#pragma once

#include <cstdint>
#include <vector>

#include "parm/device.h"
#include "schedule/schedule.h"

namespace parm::moe {

struct LayerMemory {
  int64_t parameters = 0;   // the gate, this rank's expert shards, the shared experts' shards
  int64_t routed_parameters = 0;  // of them, the routed experts' shards (reduced over edp)
  int64_t activations = 0;  // step buffers and their gradients, the gate's saved
                            // probabilities, the experts' workspace (without the pooled rows)
  // --recompute moe-act / moe: the bytes this layer needs from the model's pool, by pool key
  // (moe/activation_pool.h; the pool holds the largest need of each key over the layers).
  std::vector<int64_t> pooled;
};

// Bytes of fp32 tensors. Not predicted: the movers' communication scratch (the interleaving
// and packing buffers, a few (T, M) at most), the bf16 packed operands and weight copies, and
// a few host integers per expert.
// pool_rows: --recompute moe-act or moe (the experts' rows pooled); pool_buffers: moe (the
// step buffers MoeLayer pools too).
LayerMemory plan_layer_memory(const schedule::Schedule& sc, const MoeShape& shape,
                              const Layout& layout, Precision precision, bool pool_rows,
                              bool pool_buffers);

}  // namespace parm::moe
