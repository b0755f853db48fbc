// Buffers Parm owns, handed to torch as DLPack capsules (torch.utils.dlpack.from_dlpack
// wraps them without a copy): when torch frees such a tensor, the capsule's deleter gives
// the buffer back here and a later take() of the same shape and device reuses it. Reused
// memory is already mapped, so a pass writes its output and gradients into it without the
// page faults and kernel zeroing of fresh allocations (about 10% of a CPU forward+backward
// at the reference configuration, when torch allocated them). A taken buffer's contents are
// unspecified. Thread-safe: torch may free a tensor on any thread, without the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "parm/device.h"
#include "parm/tensor.h"

namespace parm::py_dlpack {

// A float32 buffer of `shape` on `device` (CUDA: this rank's GPU) as a DLPack capsule
// ("dltensor"), from the pool or newly allocated. A capsule never consumed frees into the
// pool when it is garbage-collected.
pybind11::capsule take(const Shape& shape, Device device);
// Free buffers held (tests).
size_t pooled();

}  // namespace parm::py_dlpack
