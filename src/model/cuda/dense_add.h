// The residual sum on the device (model/dense_ops.h's add): no CUDA or fmt headers, so that
// dense_add.cu needs nothing but the runtime.
#pragma once

#include <cstdint>

namespace parm::model {

// out (n) = a + b on the device (fp32, element by element; out may alias a or b). Queued on
// the compute stream.
void cuda_add(const float* a, const float* b, float* out, int64_t n);

}  // namespace parm::model
