// The dense kernels' argument checks (dense_checks.h).
#include "kernels/cuda/dense_checks.h"

#include <limits>
#include <string>

#include "parm/error.h"

namespace parm::cuda::dense {

void check_sizes(bool ok, const char* op, const char* names, std::initializer_list<int64_t> sizes,
                 const char* valid) {
  if (ok) [[likely]]
    return;
  std::string values;
  for (int64_t v : sizes) values += (values.empty() ? "" : ", ") + std::to_string(v);
  PARM_CHECK(ok, "cuda::{}: ({}) = ({}); valid: {}", op, names, values, valid);
}

int cublas_int(int64_t v, const char* op, const char* what) {
  PARM_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
             "cuda::{}: {} = {} does not fit cuBLAS's int arguments", op, what, v);
  return static_cast<int>(v);
}

}  // namespace parm::cuda::dense
