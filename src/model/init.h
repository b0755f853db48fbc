// Parameter initialisation that is the same on every layout: each parameter's whole tensor is
// drawn from its own counter-based stream (seed, stream of its name), element i of the whole
// row-major tensor being draw i, and a rank fills only its shard, jumping straight to the
// positions it holds (no rank ever materialises a whole expert tensor).
#pragma once

#include <cstdint>
#include <string>

#include "model/param.h"

namespace parm::model {

// Stream of a parameter: a 64-bit FNV-1a hash of its name (stable across layouts and runs).
uint64_t param_stream(const std::string& name);

// p.value = mean + stddev * N(0, 1) draws of the whole tensor at the shard's positions; equal
// to parm::fill_normal of the whole tensor, then sliced. stddev == 0: the constant mean.
void init_param_normal(Param& p, uint64_t seed, float mean, float stddev);

}  // namespace parm::model
