// The CUDA table of model/dense_ops.h (CUDA builds only).
#pragma once

#include "model/dense_ops.h"

namespace parm::model {

// The parm::cuda kernels (kernels/cuda/dense_kernels.h) behind the DenseOps contracts, on the
// process's compute stream. The ops that return a number to the host (cross_entropy,
// sum_of_squares) wait for the device; the others only queue work.
const DenseOps& cuda_dense_ops();

}  // namespace parm::model
