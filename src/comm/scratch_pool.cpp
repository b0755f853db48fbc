#include "comm/scratch_pool.h"

#include <utility>

namespace parm {

ScratchPool::Buffer ScratchPool::take(size_t bytes) {
  Buffer out;
  if (const size_t pick = pick_scratch(free_, bytes); pick != free_.size()) {
    std::swap(free_[pick], free_.back());
    out = std::move(free_.back());
    free_.pop_back();
  }
  if (out.bytes < bytes) {
    out.data = std::make_unique_for_overwrite<unsigned char[]>(bytes);
    out.bytes = bytes;
  }
  return out;
}

void ScratchPool::give_back(Buffer buffer) {
  if (buffer.data == nullptr) return;
  free_.push_back(std::move(buffer));  // capacity grows to the peak in flight, then stays
}

}  // namespace parm
