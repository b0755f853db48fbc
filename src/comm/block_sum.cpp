#include "comm/block_sum.h"

#include <cstdint>
#include <cstring>

#include "parm/error.h"

namespace parm {
namespace {

template <typename T>
void rank_order(const T* blocks, T* recv, size_t count, int n) {
  if (count == 0) return;
  std::memcpy(recv, blocks, count * sizeof(T));
  for (int q = 1; q < n; ++q) {
    const T* b = blocks + static_cast<size_t>(q) * count;
    for (size_t i = 0; i < count; ++i) recv[i] += b[i];
  }
}

template <typename T>
void binomial(T* blocks, T* recv, size_t count, int n) {
  if (count == 0) return;
  for (int d = 1; d < n; d *= 2)
    for (int r = 0; r + d < n; r += 2 * d) {
      T* acc = blocks + static_cast<size_t>(r) * count;
      const T* b = blocks + static_cast<size_t>(r + d) * count;
      for (size_t i = 0; i < count; ++i) acc[i] += b[i];
    }
  std::memcpy(recv, blocks, count * sizeof(T));
}

// Calls f with the element type of dtype.
template <typename F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kF64: return f(double{});
    case DType::kI32: return f(int32_t{});
    case DType::kI64: return f(int64_t{});
    case DType::kU8: return f(uint8_t{});  // wraps modulo 256, as MPI_SUM on MPI_UINT8_T does
  }
  throw Error("unknown dtype");
}

}  // namespace

void sum_blocks_in_rank_order(DType dtype, const void* blocks, void* recv, size_t count, int n) {
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    rank_order(static_cast<const T*>(blocks), static_cast<T*>(recv), count, n);
  });
}

void sum_blocks_binomial(DType dtype, void* blocks, void* recv, size_t count, int n) {
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    binomial(static_cast<T*>(blocks), static_cast<T*>(recv), count, n);
  });
}

}  // namespace parm
