// The fused collectives (fused.h) over whichever buffers the communicators move: host
// buffers over host communicators (fused.h itself), device buffers over staged
// communicators (staged through host memory around the host pipeline), or device buffers
// over NCCL communicators (the pipeline on two CUDA streams, src/comm/cuda/). The
// executor calls these; semantics, layouts and counters are those of fused.h.
#pragma once

#include <cstddef>

#include "comm/fused.h"

namespace parm {

void fused_dispatch_any(Communicator& ep, Communicator& esp, const float* in, float* out,
                        size_t block, int chunks);
void fused_combine_any(Communicator& esp, Communicator& ep, const float* in, float* out,
                       size_t block, int chunks, const MpGatherPart* mp_part = nullptr);

}  // namespace parm
