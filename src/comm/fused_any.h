// The fused collectives (fused.h) over whichever buffers the communicators move, each run by
// the implementation of its communicators' backend (Communicator::run_fused_dispatch /
// run_fused_combine): host buffers over MPI communicators (fused.h's host pipeline), device
// buffers over staged communicators (staged through host memory around the host pipeline),
// device buffers over NCCL communicators (the pipeline on CUDA streams, src/comm/cuda/). The
// groups of one call must share a backend; the buffers must be in its memory space. The
// executor calls these; semantics, layouts and counters are those of fused.h.
#pragma once

#include <cstddef>

#include "comm/fused.h"

namespace parm {

void fused_dispatch_any(Communicator& ep, Communicator& esp, const float* in, float* out,
                        size_t block, int chunks);
void fused_combine_any(Communicator& esp, Communicator& ep, const float* in, float* out,
                       size_t block, int chunks, const MpGatherPart* mp_part = nullptr);

// Throws parm::Error naming both groups and backends when `other` is not of `self`'s backend
// (a fused collective over a mixed pair would run one backend's pipeline on the other's
// buffers).
void check_same_backend(const Communicator& self, const Communicator& other, const char* op);
// `other` as self's backend class C, after that check.
template <typename C>
C& same_backend(const C& self, Communicator& other, const char* op) {
  check_same_backend(self, other, op);
  return static_cast<C&>(other);
}

}  // namespace parm
