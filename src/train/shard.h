// Gathering a parameter's whole (unsharded) tensor for saving. The whole <-> shard mapping
// itself is in model/param.h.
#pragma once

#include <vector>

#include "model/param.h"

namespace parm::train {

// The whole tensor `whole_shape` of `local` (a tensor shaped like p->value: the parameter, a
// gradient or an optimizer moment), assembled on world rank 0 from the owning ranks' shards.
// p null: this rank does not hold the parameter (another pipeline stage does). Collective
// over the world; other ranks get an empty tensor.
Tensor gather_whole(Topology& topo, const Shape& whole_shape, const model::Param* p,
                    const Tensor* local);

}  // namespace parm::train
