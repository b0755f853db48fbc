// Storage for packed bf16 operands (kernels.h): a std::vector of uint16_t whose data is
// 64-byte aligned. An AMX tile row is 64 bytes; packed operands at a 64-byte boundary load
// each row from one cache line. std::vector's own storage of a large operand starts 16 bytes
// past a page (glibc's mmap'd chunks), so every row straddled two lines: the AMX kernel ran
// the expert products at 590-700 GFLOP/s there against 1000-1200 aligned (one thread, same
// run, operands and kernel otherwise the same).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace parm::cpu {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

using Bf16Buffer = std::vector<uint16_t, CacheLineAllocator<uint16_t>>;

}  // namespace parm::cpu
