// Tensors from Python as DLPack capsules (torch.utils.dlpack.to_dlpack / t.__dlpack__(),
// capsule name "dltensor"; Debian's torch 1.13 exports DLPack 0.x DLManagedTensor): a view
// of the capsule's memory, checked before any work starts. The capsule is borrowed, not
// consumed: its producer's tensor owns the memory, and the view is valid while that tensor
// lives (the Python side keeps it alive for as long as the layer computes on it).
#pragma once

#include <pybind11/pybind11.h>

#include "parm/device.h"
#include "parm/tensor.h"

namespace parm::py_dlpack {

// A view of the float32 tensor in `capsule`, for the argument `what` of `op`: its dtype
// must be float32, its device `device` (CUDA: the GPU this process computes on), its strides
// row-major contiguous, and its shape `shape` (empty: any shape). Throws InvalidConfig
// naming `op`, `what`, what it got and what would be valid.
Tensor view(const pybind11::capsule& capsule, const char* op, const char* what, Device device,
            const Shape& shape = {});

// The GPU this process computes on and its compute stream as an integer (the stream
// argument of t.__dlpack__(stream=...), DLPack's convention: 1 for the legacy default
// stream); CUDA builds only, InvalidConfig otherwise.
int cuda_ordinal();
uintptr_t cuda_stream();

}  // namespace parm::py_dlpack
