// Grow-only pools of scratch buffers for operations in flight (reduce_scatter's received
// blocks, staged copies of device buffers). An operation takes a buffer when it is issued and
// gives it back when it completes, so several can be in flight at once and, after a warm-up
// with the same sizes, none allocates. A buffer whose operation never completed (a Timeout)
// is never given back: the library may still write into it, so it is leaked rather than
// handed out again.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace parm {

// The pools' choice among `free` buffers (anything with a `bytes` member): the smallest of at
// least `bytes`; when none fits, the largest, which the caller replaces by a new one of
// `bytes` (so a pool never holds more buffers than were ever in flight at once).
// free.size() when the pool is empty.
template <typename Buf>
size_t pick_scratch(const std::vector<Buf>& free, size_t bytes) {
  const size_t none = free.size();
  size_t fit = none, largest = none;
  for (size_t i = 0; i < free.size(); ++i) {
    const size_t b = free[i].bytes;
    if (b >= bytes && (fit == none || b < free[fit].bytes)) fit = i;
    if (largest == none || b > free[largest].bytes) largest = i;
  }
  return fit != none ? fit : largest;
}

// The pool over host memory.
class ScratchPool {
 public:
  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t bytes = 0;
  };
  Buffer take(size_t bytes);
  void give_back(Buffer buffer);  // an empty buffer is dropped

 private:
  std::vector<Buffer> free_;
};

}  // namespace parm
