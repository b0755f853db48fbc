// Argument checks of the dense kernels' launchers (private to src/kernels/cuda/dense_*). The
// .cu files cannot format messages (nvcc does not compile {fmt}), so the checks format here.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace parm::cuda::dense {

// Unless ok, throws parm::Error "cuda::<op>: (<names>) = (<sizes>); valid: <valid>".
void check_sizes(bool ok, const char* op, const char* names, std::initializer_list<int64_t> sizes,
                 const char* valid);

// v as a cuBLAS int argument; throws parm::Error naming op and what when v is outside
// [0, INT_MAX].
int cublas_int(int64_t v, const char* op, const char* what);

}  // namespace parm::cuda::dense
