#include "parm/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace parm {

int64_t peak_rss_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return -1;
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long pages = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  if (got != 2) return -1;
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kParameters: return "parameters";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizer: return "optimizer";
    case MemoryKind::kActivations: return "activations";
    case MemoryKind::kOther: return "other";
  }
  return "?";
}

namespace {

thread_local MemoryKind t_kind = MemoryKind::kOther;

struct Space {
  std::atomic<int64_t> current[kNumMemoryKinds] = {};
  std::atomic<int64_t> peak[kNumMemoryKinds] = {};
  std::atomic<int64_t> total{0};
  std::atomic<int64_t> peak_total{0};
};
Space g_spaces[2];  // host, device

void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

MemoryKindScope::MemoryKindScope(MemoryKind kind) : previous_(t_kind) { t_kind = kind; }
MemoryKindScope::~MemoryKindScope() { t_kind = previous_; }
MemoryKind current_memory_kind() { return t_kind; }

int64_t MemoryCounters::current_total() const {
  int64_t n = 0;
  for (int64_t b : current) n += b;
  return n;
}

void count_tensor_bytes(bool device, MemoryKind k, int64_t bytes) {
  Space& s = g_spaces[device ? 1 : 0];
  const auto i = static_cast<size_t>(k);
  const int64_t now = s.current[i].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const int64_t total = s.total.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes <= 0) return;
  raise_to(s.peak[i], now);
  raise_to(s.peak_total, total);
}

MemoryCounters memory_counters(bool device) {
  const Space& s = g_spaces[device ? 1 : 0];
  MemoryCounters c;
  for (int i = 0; i < kNumMemoryKinds; ++i) {
    c.current[static_cast<size_t>(i)] = s.current[i].load(std::memory_order_relaxed);
    c.peak[static_cast<size_t>(i)] = s.peak[i].load(std::memory_order_relaxed);
  }
  c.peak_total = s.peak_total.load(std::memory_order_relaxed);
  return c;
}

void reset_memory_peaks() {
  for (Space& s : g_spaces) {
    for (int i = 0; i < kNumMemoryKinds; ++i)
      s.peak[i].store(s.current[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    s.peak_total.store(s.total.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

}  // namespace parm
