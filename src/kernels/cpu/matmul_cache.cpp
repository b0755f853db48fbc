// oneDNN matmul primitives, created once per (shape, strides, transposition, accumulate,
// threads) and reused: creating one costs tens to hundreds of microseconds, more than a small
// GEMM, while executing a cached one costs about a microsecond on top of the kernel.
#include "kernels/cpu/matmul_cache.h"

#include <oneapi/dnnl/dnnl.h>

#include <array>
#include <cstddef>
#include <functional>
#include <unordered_map>

#include "kernels/cpu/dnnl_check.h"

namespace parm::cpu::detail {
namespace {

// Past this many shapes in one thread the cache starts over: real runs use a handful.
constexpr size_t kMaxCachedShapes = 256;

struct Key {
  std::array<int64_t, 6> dims;  // m, n, k, lda, ldb, ldc
  uint8_t flags;                // trans_a | trans_b << 1 | accumulate << 2
  int num_threads;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<int>{}(key.num_threads * 8 + key.flags);
    for (int64_t d : key.dims) h = h * 1000003u ^ std::hash<int64_t>{}(d);
    return h;
  }
};

// The process-wide CPU engine.
dnnl_engine_t cpu_engine() {
  // Never destroyed: thread-local caches holding primitives of this engine may outlive any
  // static destructor order we could pick.
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    PARM_DNNL_CHECK(dnnl_engine_create(&e, dnnl_cpu, 0));
    return e;
  }();
  return engine;
}

// A primitive and the memory objects bound to it; only the data pointers change per call.
class Entry {
 public:
  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    // Destroy functions only fail on null handles, which they accept: nothing to report.
    if (prim_ != nullptr) dnnl_primitive_destroy(prim_);
    for (dnnl_memory_t mem : {a_, b_, c_})
      if (mem != nullptr) dnnl_memory_destroy(mem);
  }

  void init(const Key& key, dnnl_engine_t engine);
  void run(const float* a, const float* b, float* c, dnnl_stream_t stream);

 private:
  dnnl_primitive_t prim_ = nullptr;
  dnnl_memory_t a_ = nullptr;
  dnnl_memory_t b_ = nullptr;
  dnnl_memory_t c_ = nullptr;
};

// Owns a primitive attribute / post-op list for the duration of primitive creation.
struct AttrHolder {
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  ~AttrHolder() {
    if (pd != nullptr) dnnl_primitive_desc_destroy(pd);
    if (post_ops != nullptr) dnnl_post_ops_destroy(post_ops);
    if (attr != nullptr) dnnl_primitive_attr_destroy(attr);
  }
};

void Entry::init(const Key& key, dnnl_engine_t engine) {
  const auto [m, n, k, lda, ldb, ldc] = key.dims;
  const bool trans_a = key.flags & 1;
  const bool trans_b = key.flags & 2;
  const bool accumulate = key.flags & 4;
  // Logical shapes A (m, k), B (k, n), C (m, n); a transposed operand is the stored matrix
  // read with swapped strides.
  const dnnl_dims_t a_dims = {m, k};
  const dnnl_dims_t b_dims = {k, n};
  const dnnl_dims_t c_dims = {m, n};
  const dnnl_dims_t a_strides = {trans_a ? 1 : lda, trans_a ? lda : 1};
  const dnnl_dims_t b_strides = {trans_b ? 1 : ldb, trans_b ? ldb : 1};
  const dnnl_dims_t c_strides = {ldc, 1};
  dnnl_memory_desc_t a_md, b_md, c_md;
  PARM_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_f32, a_strides));
  PARM_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_f32, b_strides));
  PARM_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides));
  dnnl_matmul_desc_t desc;
  PARM_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md));

  AttrHolder h;
  PARM_DNNL_CHECK(dnnl_primitive_attr_create(&h.attr));
  if (accumulate) {
    // C += A B is matmul with a sum post-op of scale 1 (beta = 1).
    PARM_DNNL_CHECK(dnnl_post_ops_create(&h.post_ops));
    PARM_DNNL_CHECK(dnnl_post_ops_append_sum(h.post_ops, 1.0f));
    PARM_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(h.attr, h.post_ops));
  }
  PARM_DNNL_CHECK(dnnl_primitive_desc_create(&h.pd, &desc, h.attr, engine, nullptr));
  PARM_DNNL_CHECK(dnnl_primitive_create(&prim_, h.pd));
  PARM_DNNL_CHECK(dnnl_memory_create(&a_, &a_md, engine, DNNL_MEMORY_NONE));
  PARM_DNNL_CHECK(dnnl_memory_create(&b_, &b_md, engine, DNNL_MEMORY_NONE));
  PARM_DNNL_CHECK(dnnl_memory_create(&c_, &c_md, engine, DNNL_MEMORY_NONE));
}

void Entry::run(const float* a, const float* b, float* c, dnnl_stream_t stream) {
  // oneDNN takes non-const handles but does not write the inputs.
  PARM_DNNL_CHECK(dnnl_memory_set_data_handle(a_, const_cast<float*>(a)));
  PARM_DNNL_CHECK(dnnl_memory_set_data_handle(b_, const_cast<float*>(b)));
  PARM_DNNL_CHECK(dnnl_memory_set_data_handle(c_, c));
  const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}};
  PARM_DNNL_CHECK(dnnl_primitive_execute(prim_, stream, 3, args));
  PARM_DNNL_CHECK(dnnl_stream_wait(stream));
}

// Per thread: a stream and the primitives this thread has used. Keeping both thread-local
// needs no locks and keeps concurrent callers from sharing a primitive's scratchpad.
class ThreadCache {
 public:
  ThreadCache() {
    PARM_DNNL_CHECK(dnnl_stream_create(&stream_, cpu_engine(), dnnl_stream_default_flags));
  }
  ~ThreadCache() {
    entries_.clear();
    if (stream_ != nullptr) dnnl_stream_destroy(stream_);
  }

  Entry& get(const Key& key) {
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    if (entries_.size() >= kMaxCachedShapes) entries_.clear();
    // A failed creation erases its entry: no half-built primitive stays cached.
    auto [pos, inserted] = entries_.try_emplace(key);
    try {
      pos->second.init(key, cpu_engine());
    } catch (...) {
      entries_.erase(pos);
      throw;
    }
    return pos->second;
  }
  dnnl_stream_t stream() const { return stream_; }

 private:
  dnnl_stream_t stream_ = nullptr;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace

void matmul_cached(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                   int num_threads) {
  thread_local ThreadCache cache;
  const Key key{{m, n, k, lda, ldb, ldc},
                static_cast<uint8_t>((trans_a ? 1 : 0) | (trans_b ? 2 : 0) | (accumulate ? 4 : 0)),
                num_threads};
  cache.get(key).run(a, b, c, cache.stream());
}

}  // namespace parm::cpu::detail
