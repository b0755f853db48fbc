// Process memory, for reports: the resident set, and the bytes every Tensor allocation holds,
// counted by what the bytes are for (the allocator's own counters).
#pragma once

#include <array>
#include <cstdint>

namespace parm {

// Peak resident set size of this process so far (bytes; getrusage's ru_maxrss).
int64_t peak_rss_bytes();
// Resident set size now (bytes; /proc/self/statm), or -1 where it cannot be read.
int64_t current_rss_bytes();

// What a Tensor's bytes hold. An owned Tensor is counted under the kind in force on its
// thread when it is allocated (MemoryKindScope), until its storage is freed.
enum class MemoryKind : int {
  kParameters = 0,  // trainable values
  kGradients,       // their gradients
  kOptimizer,       // optimizer state (AdamW's moments)
  kActivations,     // what forward passes keep for the backward (and its recompute scratch)
  kOther,           // everything else: gradient scratch, communication and staging buffers
};
inline constexpr int kNumMemoryKinds = 5;
const char* memory_kind_name(MemoryKind k);  // "parameters", "gradients", ...

// Sets the kind of the allocations this thread makes while it lives; restores the previous
// kind when it ends (scopes nest).
class MemoryKindScope {
 public:
  explicit MemoryKindScope(MemoryKind kind);
  ~MemoryKindScope();
  MemoryKindScope(const MemoryKindScope&) = delete;
  MemoryKindScope& operator=(const MemoryKindScope&) = delete;

 private:
  MemoryKind previous_;
};
MemoryKind current_memory_kind();

// Bytes held by owned Tensors of one memory space (host, or the accelerator's), by kind: now,
// the most each kind held at any time, and the most all kinds held together at any time
// (not the sum of the kinds' peaks, which need not coincide).
struct MemoryCounters {
  std::array<int64_t, kNumMemoryKinds> current{};
  std::array<int64_t, kNumMemoryKinds> peak{};
  int64_t peak_total = 0;
  int64_t current_total() const;
};
// `device`: the accelerator's counters; else the host's. Thread-safe.
MemoryCounters memory_counters(bool device);
// Counts `bytes` allocated (positive) or freed (negative) of kind k (the Tensor allocator).
void count_tensor_bytes(bool device, MemoryKind k, int64_t bytes);
// Starts the peaks again from the bytes held now (tests; a run's report measures from start).
void reset_memory_peaks();

}  // namespace parm
