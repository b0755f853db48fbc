// Storage for packed bf16 operands (kernels.h): a std::vector of uint16_t whose data is
// 64-byte aligned. An AMX tile row is 64 bytes; packed operands at a 64-byte boundary load
// each row from one cache line. std::vector's own storage of a large operand starts 16 bytes
// past a page (glibc's mmap'd chunks), so every row straddled two lines: the AMX kernel ran
// the expert products at 590-700 GFLOP/s there against 1000-1200 aligned (one thread, same
// run, operands and kernel otherwise the same).
// The bytes are counted in parm/memory.h's host counters under the memory kind in force when
// they are allocated (kept in a 64-byte header before the data, so the free counts the same).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "parm/memory.h"

namespace parm::cpu {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  static constexpr size_t kHeader = 64;
  struct Header {
    MemoryKind kind;
    int64_t bytes;
  };
  T* allocate(size_t n) {
    const auto bytes = static_cast<int64_t>(n * sizeof(T));
    auto* raw = static_cast<unsigned char*>(::operator new(kHeader + n * sizeof(T), kAlign));
    auto* h = reinterpret_cast<Header*>(raw);
    h->kind = current_memory_kind();
    h->bytes = bytes;
    count_tensor_bytes(false, h->kind, bytes);
    return reinterpret_cast<T*>(raw + kHeader);
  }
  void deallocate(T* p, size_t) {
    auto* raw = reinterpret_cast<unsigned char*>(p) - kHeader;
    const auto* h = reinterpret_cast<const Header*>(raw);
    count_tensor_bytes(false, h->kind, -h->bytes);
    ::operator delete(raw, kAlign);
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

using Bf16Buffer = std::vector<uint16_t, CacheLineAllocator<uint16_t>>;

}  // namespace parm::cpu
