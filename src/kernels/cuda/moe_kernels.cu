// CUDA kernels of the MoE gate, dispatch, combine and the local data movement, and their
// launchers (moe_kernels.h). The per-row maths is moe_math.h; this file adds the threading.
//
// Threading, and why it keeps every result deterministic (no float atomics anywhere):
// - softmax, top-k + weights, weights backward, softmax backward: one thread per row (E is
//   small; the row's operation order is the CPU's).
// - slots + statistics: one block per expert scans the (k, T) priority order in chunks
//   (flags staged in shared memory, a block-wide exclusive scan of per-thread counts of
//   contiguous items): positions are exact integers. The same block sums its column of the
//   probabilities in a fixed tree.
// - dispatch forward / dbuf of the combine backward: one block per buffer row, gathered
//   through the inverse map `source` (every row written once, unfilled ones zeroed); in the
//   packed layout one block per choice, written to its row (rows are distinct).
// - the packed layout's renumbering: every block forms the expert starts in shared memory
//   (one thread; E is small), then a grid-stride loop over the choices.
// - dispatch backward, combine forward: one block per token, its k choices in order.
// - combine dweight: 16 lanes (a half warp) per choice, lane l summing the elements
//   i = l (mod 16) as the CPU's 16-lane dot product does, the partials added in lane order.
#include <cstdint>
#include <string>

#include "kernels/cuda/moe_kernels.h"
#include "kernels/math/moe_math.h"
#include "kernels/cuda/runtime.h"

// parm/error.h pulls in fmt, whose headers do not compile under nvcc: the launchers' checks
// call its thrower (src/core/error.cpp) directly, with messages built by hand.
namespace parm::detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& msg);
}  // namespace parm::detail
#define PARM_KERNEL_CHECK(cond, msg)                                                  \
  do {                                                                                \
    if (!(cond)) [[unlikely]]                                                         \
      ::parm::detail::throw_check_failure(__FILE__, __LINE__, #cond, (msg));          \
  } while (0)

namespace parm::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- per-row gate kernels ----

__global__ void softmax_kernel(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    math::softmax_row(x + r * cols, y + r * cols, cols);
}

__global__ void topk_weights_kernel(const float* probs, int64_t rows, int64_t experts, int k,
                                    int32_t* expert, float* prob, float* weight) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    math::topk_row(probs + r * experts, experts, k, expert + r * k, prob + r * k);
    math::combine_weights(prob + r * k, k, weight + r * k);
  }
}

__global__ void weights_backward_kernel(const int32_t* expert, const float* prob,
                                        const float* dweight, const float* dpsum, int64_t rows,
                                        int64_t experts, int k, float* dprobs) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    math::weights_backward_row(expert + r * k, prob + r * k, dweight + r * k, k, dpsum, experts,
                               dprobs + r * experts);
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, int64_t rows,
                                        int64_t cols) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    math::softmax_backward_row(y + r * cols, dy + r * cols, dx + r * cols, cols);
}

// ---- slots + statistics ----

using math::kSlotChunk;
using math::kSlotItems;
using math::kSlotThreads;
constexpr int kSlotWarps = kSlotThreads / 32;

// Exclusive prefix sum of v over the block (kSlotThreads threads, all must call); *total =
// the block's sum. s_warp: kSlotWarps ints of shared memory, free again once this returns
// and the caller has passed another __syncthreads().
__device__ int block_exclusive_scan(int v, int* total, int* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kSlotWarps ? s_warp[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kSlotWarps) s_warp[lane] = w;
  }
  __syncthreads();
  *total = s_warp[kSlotWarps - 1];
  return (warp > 0 ? s_warp[warp - 1] : 0) + x - v;
}

// Sum over the block in a fixed tree (valid in thread 0). s_red: kSlotWarps floats.
__device__ float block_sum(float v, float* s_red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  if (lane == 0) s_red[warp] = v;
  __syncthreads();
  float r = 0.0f;
  if (warp == 0) {
    r = lane < kSlotWarps ? s_red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) r += __shfl_down_sync(kFullMask, r, o);
  }
  return r;
}

// One block per expert e.
__global__ void __launch_bounds__(kSlotThreads)
    slots_stats_kernel(const int32_t* expert, const float* probs, int64_t tokens,
                       int64_t experts, int k, int64_t capacity, int64_t slots, int32_t* row,
                       int32_t* source, int32_t* fill, float* stats) {
  __shared__ unsigned char s_flag[kSlotChunk];
  __shared__ int s_warp[kSlotWarps];
  __shared__ float s_red[kSlotWarps];
  const int64_t e = blockIdx.x;
  const int64_t n = tokens * k;
  const int tid = threadIdx.x;
  int taken = 0;   // choices of e in the chunks before this one (same in every thread)
  int first = 0;   // this thread's 1st choices of e
  for (int64_t base = 0; base < n; base += kSlotChunk) {
    __syncthreads();  // the previous chunk's reads of s_flag and s_warp are done
    for (int u = 0; u < kSlotItems; ++u) {
      const int local = u * kSlotThreads + tid;  // coalesced loads
      const int64_t i = base + local;
      s_flag[local] = i < n && expert[math::priority_choice(i, tokens, k)] == e;
    }
    __syncthreads();
    const int mine = tid * kSlotItems;  // this thread's contiguous items
    int count = 0;
    for (int u = 0; u < kSlotItems; ++u) count += s_flag[mine + u];
    int total = 0;
    const int pos = taken + block_exclusive_scan(count, &total, s_warp);
    math::assign_slots(s_flag + mine, kSlotItems, base + mine, tokens, k, e, pos, capacity,
                       slots, row, source, &first);
    taken += total;
  }
  float psum = 0.0f;
  for (int64_t t = tid; t < tokens; t += kSlotThreads) psum += probs[t * experts + e];
  __syncthreads();
  psum = block_sum(psum, s_red);
  __syncthreads();
  const float first_total = block_sum(static_cast<float>(first), s_red);  // exact: < 2^24
  if (tid == 0) {
    fill[e] = static_cast<int32_t>(taken < capacity ? taken : capacity);
    stats[e] = first_total;
    stats[experts + e] = psum;
  }
}

// ---- the packed layout ----

constexpr int kPackThreads = 256;

// Every block computes the starts (E small) into shared memory, block 0 also to `first`; then
// each kept choice's row moves to its expert's start.
__global__ void __launch_bounds__(kPackThreads)
    pack_routing_kernel(const int32_t* expert, const int32_t* fill, int64_t choices,
                        int64_t experts, int64_t slots, int32_t* row, int32_t* first) {
  extern __shared__ int32_t s_first[];
  if (threadIdx.x == 0) {
    parm::packed_starts(fill, experts, s_first);
    if (blockIdx.x == 0)
      for (int64_t e = 0; e < experts; ++e) first[e] = s_first[e];
  }
  __syncthreads();
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < choices;
       c += int64_t{gridDim.x} * blockDim.x) {
    const int32_t e = expert[c];
    row[c] = math::packed_row(row[c], e, slots, s_first[e]);
  }
}

// ---- dispatch / combine ----

constexpr int kRowThreads = 128;

// dst (model_dim) = scale[c] * x row c / k (scale null: a plain copy), by the block's threads.
template <bool kVec4>
__device__ __forceinline__ void write_choice_row(const float* x, int64_t c, const float* scale,
                                                 int k, int64_t model_dim, float* dst) {
  const float* src = x + math::choice_token(c, k) * model_dim;
  if (scale == nullptr) {
    if constexpr (kVec4) {
      for (int64_t m = threadIdx.x; m < model_dim / 4; m += kRowThreads)
        reinterpret_cast<float4*>(dst)[m] = reinterpret_cast<const float4*>(src)[m];
    } else {
      for (int64_t m = threadIdx.x; m < model_dim; m += kRowThreads) dst[m] = src[m];
    }
    return;
  }
  const float w = scale[c];
  if constexpr (kVec4) {
    for (int64_t m = threadIdx.x; m < model_dim / 4; m += kRowThreads) {
      const float4 v = reinterpret_cast<const float4*>(src)[m];
      reinterpret_cast<float4*>(dst)[m] =
          make_float4(math::mul_nc(w, v.x), math::mul_nc(w, v.y), math::mul_nc(w, v.z),
                      math::mul_nc(w, v.w));
    }
  } else {
    for (int64_t m = threadIdx.x; m < model_dim; m += kRowThreads)
      dst[m] = math::mul_nc(w, src[m]);
  }
}

// One block per buffer row r = e * slots + s.
template <bool kVec4>
__global__ void __launch_bounds__(kRowThreads)
    gather_slots_kernel(const float* x, const int32_t* source, const int32_t* fill,
                        const float* scale, int64_t tokens, int k, int64_t slots,
                        int64_t model_dim, float* buf) {
  const int64_t r = blockIdx.x;
  const int64_t e = r / slots, s = r - e * slots;
  float* dst = buf + r * model_dim;
  if (s >= fill[e]) {
    if constexpr (kVec4) {
      for (int64_t m = threadIdx.x; m < model_dim / 4; m += kRowThreads)
        reinterpret_cast<float4*>(dst)[m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      for (int64_t m = threadIdx.x; m < model_dim; m += kRowThreads) dst[m] = 0.0f;
    }
    return;
  }
  const int64_t c = source[e * tokens + s];
  write_choice_row<kVec4>(x, c, scale, k, model_dim, dst);
}

// One block per choice c: buf row row[c] (kept choices only).
template <bool kVec4>
__global__ void __launch_bounds__(kRowThreads)
    scatter_choices_kernel(const float* x, const int32_t* row, const float* scale, int k,
                           int64_t model_dim, float* buf) {
  const int64_t c = blockIdx.x;
  const int32_t r = row[c];
  if (r < 0) return;
  write_choice_row<kVec4>(x, c, scale, k, model_dim, buf + int64_t{r} * model_dim);
}

// One block per token t.
template <bool kVec4>
__global__ void __launch_bounds__(kRowThreads)
    dispatch_backward_kernel(const float* dbuf, const int32_t* row, int k, int64_t model_dim,
                             float* dx) {
  const int64_t t = blockIdx.x;
  const int32_t* rt = row + t * k;
  float* d = dx + t * model_dim;
  if constexpr (kVec4) {
    for (int64_t m = threadIdx.x; m < model_dim / 4; m += kRowThreads) {
      float4 acc = reinterpret_cast<const float4*>(d)[m];
      for (int j = 0; j < k; ++j) {
        if (rt[j] < 0) continue;
        const float4 v = reinterpret_cast<const float4*>(dbuf + rt[j] * model_dim)[m];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      reinterpret_cast<float4*>(d)[m] = acc;
    }
  } else {
    for (int64_t m = threadIdx.x; m < model_dim; m += kRowThreads)
      d[m] = math::dispatch_backward_element(d[m], rt, k, dbuf, model_dim, m);
  }
}

// One block per token t.
template <bool kVec4>
__global__ void __launch_bounds__(kRowThreads)
    combine_forward_kernel(const float* buf, const int32_t* row, const float* weight, int k,
                           int64_t model_dim, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t* rt = row + t * k;
  const float* wt = weight + t * k;
  float* o = out + t * model_dim;
  if constexpr (kVec4) {
    for (int64_t m = threadIdx.x; m < model_dim / 4; m += kRowThreads) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int j = 0; j < k; ++j) {
        if (rt[j] < 0) continue;
        const float w = wt[j];
        const float4 v = reinterpret_cast<const float4*>(buf + rt[j] * model_dim)[m];
        acc.x += math::mul_nc(w, v.x);
        acc.y += math::mul_nc(w, v.y);
        acc.z += math::mul_nc(w, v.z);
        acc.w += math::mul_nc(w, v.w);
      }
      reinterpret_cast<float4*>(o)[m] = acc;
    }
  } else {
    for (int64_t m = threadIdx.x; m < model_dim; m += kRowThreads)
      o[m] = math::combine_element(rt, wt, k, buf, model_dim, m);
  }
}

constexpr int kDotThreads = 256;
constexpr int kDotPerBlock = kDotThreads / math::kLanes;  // choices per block

__global__ void __launch_bounds__(kDotThreads)
    combine_dweight_kernel(const float* buf, const float* dout, const int32_t* row,
                           int64_t choices, int k, int64_t model_dim, float* dweight) {
  const int lane = threadIdx.x % math::kLanes;
  const int64_t c = blockIdx.x * int64_t{kDotPerBlock} + threadIdx.x / math::kLanes;
  const int32_t r = c < choices ? row[c] : -1;
  float acc = 0.0f;
  if (r >= 0)
    acc = math::dot_lane(dout + (c / k) * model_dim, buf + int64_t{r} * model_dim, model_dim,
                         lane);
  // Every lane of the warp takes part in the shuffles; each half warp adds its own 16
  // partials in lane order (sum_lanes).
  const int half = threadIdx.x & 31 & ~(math::kLanes - 1);
  float sum = 0.0f;
  for (int j = 0; j < math::kLanes; ++j) sum += __shfl_sync(kFullMask, acc, half + j);
  if (lane == 0 && c < choices) dweight[c] = r >= 0 ? sum : 0.0f;
}

// ---- local data movement ----

// Row r of `rows` rows of `width` elements (of type V) moves from src + src_off(r) to
// dst + dst_off(r); offsets in V units.
struct TakeChunkMap {
  int64_t n, j, width;
  __device__ int64_t src(int64_t r) const { return (r * n + j) * width; }
  __device__ int64_t dst(int64_t r) const { return r * width; }
};
struct InterleaveMap {
  int64_t outer, n, width;  // row r = p * outer + o of parts
  __device__ int64_t src(int64_t r) const { return r * width; }
  __device__ int64_t dst(int64_t r) const {
    const int64_t p = r / outer, o = r - p * outer;
    return (o * n + p) * width;
  }
};

template <class V, class Map>
__global__ void copy_rows_kernel(const V* src, V* dst, int64_t rows, int64_t width, Map map) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    dst[map.dst(r) + c] = src[map.src(r) + c];
  }
}

__global__ void add_kernel(float* dst, const float* src, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
}

__global__ void add4_kernel(float4* dst, const float4* src, int64_t count4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count4;
       i += int64_t{gridDim.x} * blockDim.x) {
    float4 a = dst[i];
    const float4 b = src[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    dst[i] = a;
  }
}

template <class Map>
void copy_rows(const float* src, float* dst, int64_t rows, int64_t width, bool vec4, Map map) {
  constexpr int kBlock = 256;
  if (vec4) {
    map.width = width / 4;
    copy_rows_kernel<<<grid_for(rows * (width / 4), kBlock), kBlock, 0, stream()>>>(
        reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(dst), rows, width / 4,
        map);
  } else {
    copy_rows_kernel<<<grid_for(rows * width, kBlock), kBlock, 0, stream()>>>(src, dst, rows,
                                                                             width, map);
  }
  PARM_CUDA_CHECK_LAUNCH();
}

constexpr int kRowKernelBlock = 128;  // one thread per row

unsigned row_grid(int64_t rows) { return grid_for(rows, kRowKernelBlock); }

void check_grid(int64_t blocks, const char* what) {
  PARM_KERNEL_CHECK(blocks <= INT32_MAX, std::string(what) + ": " + std::to_string(blocks) +
                                            " thread blocks exceed the grid limit");
}

}  // namespace

void moe_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  softmax_kernel<<<row_grid(rows), kRowKernelBlock, 0, stream()>>>(x, y, rows, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_topk_weights(const float* probs, int64_t rows, int64_t experts, int k, int32_t* expert,
                      float* prob, float* weight) {
  PARM_KERNEL_CHECK(k >= 1 && k <= experts && experts <= INT32_MAX,
                    "moe_topk_weights: k = " + std::to_string(k) +
                        ", E = " + std::to_string(experts));
  if (rows == 0) return;
  topk_weights_kernel<<<row_grid(rows), kRowKernelBlock, 0, stream()>>>(probs, rows, experts, k,
                                                                        expert, prob, weight);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_slots_stats(const int32_t* expert, const float* probs, int64_t rows, int64_t experts,
                     int k, int64_t capacity, int64_t slots, int32_t* row, int32_t* source,
                     int32_t* fill, float* stats) {
  PARM_KERNEL_CHECK(k >= 1 && k <= experts, "moe_slots_stats: k = " + std::to_string(k) +
                                                ", E = " + std::to_string(experts));
  PARM_KERNEL_CHECK(capacity >= 0 && capacity <= slots,
                    "moe_slots_stats: capacity " + std::to_string(capacity) +
                        " outside [0, slots = " + std::to_string(slots) + "]");
  PARM_KERNEL_CHECK(rows * k <= INT32_MAX && experts * slots <= INT32_MAX &&
                        experts * rows <= INT32_MAX,
                    "moe_slots_stats: rows " + std::to_string(rows) + " x k " +
                        std::to_string(k) + ", E " + std::to_string(experts) + " x slots " +
                        std::to_string(slots) + " or E x rows overflow the int32 routing");
  check_grid(experts, "moe_slots_stats");
  if (experts == 0) return;
  slots_stats_kernel<<<static_cast<unsigned>(experts), kSlotThreads, 0, stream()>>>(
      expert, probs, rows, experts, k, capacity, slots, row, source, fill, stats);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_pack_routing(const int32_t* expert, const int32_t* fill, int64_t rows, int k,
                      int64_t experts, int64_t slots, int32_t* row, int32_t* first) {
  // The starts live in shared memory: 48 KiB hold 12288 experts.
  PARM_KERNEL_CHECK(experts >= 1 && experts <= 12288 && k >= 1 && rows * k <= INT32_MAX,
                    "moe_pack_routing: E = " + std::to_string(experts) + " (1 to 12288), k = " +
                        std::to_string(k) + ", rows " + std::to_string(rows));
  const int64_t choices = rows * k;
  const unsigned grid = choices > 0 ? grid_for(choices, kPackThreads) : 1u;
  pack_routing_kernel<<<grid, kPackThreads, static_cast<size_t>(experts) * sizeof(int32_t),
                        stream()>>>(expert, fill, choices, experts, slots, row, first);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_weights_backward(const int32_t* expert, const float* prob, const float* dweight,
                          const float* dpsum, int64_t rows, int64_t experts, int k,
                          float* dprobs) {
  if (rows == 0 || experts == 0) return;
  weights_backward_kernel<<<row_grid(rows), kRowKernelBlock, 0, stream()>>>(
      expert, prob, dweight, dpsum, rows, experts, k, dprobs);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols) {
  if (rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<row_grid(rows), kRowKernelBlock, 0, stream()>>>(y, dy, dx, rows,
                                                                            cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_gather_slots(const float* x, const int32_t* source, const int32_t* fill,
                      const float* scale, int64_t rows, int64_t experts, int k, int64_t slots,
                      int64_t model_dim, float* buf) {
  const int64_t buf_rows = experts * slots;
  if (buf_rows == 0 || model_dim == 0) return;
  check_grid(buf_rows, "moe_gather_slots");
  const auto grid = static_cast<unsigned>(buf_rows);
  if (model_dim % 4 == 0 && aligned16(x) && aligned16(buf))
    gather_slots_kernel<true><<<grid, kRowThreads, 0, stream()>>>(x, source, fill, scale, rows,
                                                                  k, slots, model_dim, buf);
  else
    gather_slots_kernel<false><<<grid, kRowThreads, 0, stream()>>>(x, source, fill, scale, rows,
                                                                   k, slots, model_dim, buf);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_scatter_choices(const float* x, const int32_t* row, const float* scale, int64_t rows,
                         int k, int64_t model_dim, float* buf) {
  const int64_t choices = rows * k;
  if (choices == 0 || model_dim == 0) return;
  check_grid(choices, "moe_scatter_choices");
  const auto grid = static_cast<unsigned>(choices);
  if (model_dim % 4 == 0 && aligned16(x) && aligned16(buf))
    scatter_choices_kernel<true><<<grid, kRowThreads, 0, stream()>>>(x, row, scale, k,
                                                                     model_dim, buf);
  else
    scatter_choices_kernel<false><<<grid, kRowThreads, 0, stream()>>>(x, row, scale, k,
                                                                      model_dim, buf);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_dispatch_backward(const float* dbuf, const int32_t* row, int64_t rows, int k,
                           int64_t model_dim, float* dx) {
  if (rows == 0 || model_dim == 0) return;
  check_grid(rows, "moe_dispatch_backward");
  const auto grid = static_cast<unsigned>(rows);
  if (model_dim % 4 == 0 && aligned16(dbuf) && aligned16(dx))
    dispatch_backward_kernel<true><<<grid, kRowThreads, 0, stream()>>>(dbuf, row, k, model_dim,
                                                                       dx);
  else
    dispatch_backward_kernel<false><<<grid, kRowThreads, 0, stream()>>>(dbuf, row, k, model_dim,
                                                                        dx);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_combine_forward(const float* buf, const int32_t* row, const float* weight,
                         int64_t rows, int k, int64_t model_dim, float* out) {
  if (rows == 0 || model_dim == 0) return;
  check_grid(rows, "moe_combine_forward");
  const auto grid = static_cast<unsigned>(rows);
  if (model_dim % 4 == 0 && aligned16(buf) && aligned16(out))
    combine_forward_kernel<true><<<grid, kRowThreads, 0, stream()>>>(buf, row, weight, k,
                                                                     model_dim, out);
  else
    combine_forward_kernel<false><<<grid, kRowThreads, 0, stream()>>>(buf, row, weight, k,
                                                                      model_dim, out);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_combine_dweight(const float* buf, const float* dout, const int32_t* row, int64_t rows,
                         int k, int64_t model_dim, float* dweight) {
  const int64_t choices = rows * k;
  if (choices == 0) return;
  const int64_t blocks = (choices + kDotPerBlock - 1) / kDotPerBlock;
  check_grid(blocks, "moe_combine_dweight");
  combine_dweight_kernel<<<static_cast<unsigned>(blocks), kDotThreads, 0, stream()>>>(
      buf, dout, row, choices, k, model_dim, dweight);
  PARM_CUDA_CHECK_LAUNCH();
}

void moe_take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk, float* mine) {
  PARM_KERNEL_CHECK(j >= 0 && j < n, "moe_take_chunk: part " + std::to_string(j) + " of " +
                                         std::to_string(n));
  if (outer == 0 || chunk == 0) return;
  const bool vec4 = chunk % 4 == 0 && aligned16(full) && aligned16(mine);
  copy_rows(full, mine, outer, chunk, vec4, TakeChunkMap{n, j, chunk});
}

void moe_interleave(const float* parts, int64_t outer, int n, int64_t chunk, float* full) {
  if (outer == 0 || chunk == 0 || n == 0) return;
  const bool vec4 = chunk % 4 == 0 && aligned16(parts) && aligned16(full);
  copy_rows(parts, full, int64_t{n} * outer, chunk, vec4, InterleaveMap{outer, n, chunk});
}

void moe_add(float* dst, const float* src, int64_t count) {
  if (count == 0) return;
  constexpr int kBlock = 256;
  if (count % 4 == 0 && aligned16(dst) && aligned16(src)) {
    add4_kernel<<<grid_for(count / 4, kBlock), kBlock, 0, stream()>>>(
        reinterpret_cast<float4*>(dst), reinterpret_cast<const float4*>(src), count / 4);
  } else {
    add_kernel<<<grid_for(count, kBlock), kBlock, 0, stream()>>>(dst, src, count);
  }
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
