// The experts' CUDA kernels (see expert_kernels.h) and their launchers. Argument checks live
// in the callers; the launchers only skip empty work.
#include "kernels/cuda/expert_kernels.h"

#include <algorithm>

#include "kernels/cuda/expert_math.h"
#include "kernels/cuda/runtime.h"

namespace parm::cuda {
namespace {

constexpr int kThreads = 256;
// Column-sum blocks: one warp of consecutive columns (coalesced rows) x kRowThreads threads
// down the rows of a chunk.
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;
static_assert(kColTile * kRowThreads == kThreads, "column-sum block size");
static_assert(kColumnSumChunkRows % kRowThreads == 0, "column-sum chunk");

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// An fp32 or bf16 value (Values) as fp32.
__device__ inline float load(const void* p, bool bf16, int64_t i) {
  return bf16 ? expert_math::bf16_to_f32(static_cast<const uint16_t*>(p)[i])
              : static_cast<const float*>(p)[i];
}

// The per-expert row counts and first elements (ExpertRows::at) of one launch (kernel
// argument), block y (or z) = expert.
struct RowTable {
  int64_t at[kMaxExpertsPerLaunch];
  int32_t rows[kMaxExpertsPerLaunch];
};
static_assert(sizeof(RowTable) <= 3 * 1024, "kernel arguments are limited to 4 KiB in all");

// Block y = expert e of the launch: a grid-stride loop over its rows[e] x cols elements from
// element at[e]. The column is found with a modulo; Index is uint32_t whenever the indices
// fit (a 64-bit modulo costs several times more on the GPU).
template <class Index>
__global__ void bias_gelu_kernel(const void* pre, bool pre_bf16, const float* __restrict__ bias,
                                 float* __restrict__ act, uint16_t* __restrict__ act_bf16,
                                 const RowTable table, Index cols) {
  const int64_t e = blockIdx.y;
  const Index n = static_cast<Index>(table.rows[e]) * cols;
  const int64_t base = table.at[e];
  const float* b = bias + e * static_cast<int64_t>(cols);
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t at = base + static_cast<int64_t>(i);
    const float a = expert_math::gelu(load(pre, pre_bf16, at) + b[i % cols]);
    if (act != nullptr) act[at] = a;
    if (act_bf16 != nullptr) act_bf16[at] = expert_math::f32_to_bf16(a);
  }
}

// True when every index of a grid-stride loop over n elements (up to n + the grid's stride)
// fits in 32 bits.
bool fits_u32(int64_t n) { return n + static_cast<int64_t>(grid_for(n)) * kThreads < (1LL << 32); }

__global__ void to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    y[i] = expert_math::f32_to_bf16(x[i]);
}

__global__ void fill_pattern_kernel(float* x, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    x[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
}

// partial (chunks, cols) of expert e = block z, at e * partial_stride: the sum of each of its
// columns over one chunk of kColumnSumChunkRows rows (block y = chunk; chunks past the
// expert's rows return at once): every thread sums rows y, y + kRowThreads, ... of its column
// in order, then a fixed tree adds the kRowThreads sums. kGelu: the summed values are
// dpre = gelu'(pre + bias) * src, written to dpre (and dpre_bf16) on the way (dpre may be
// src: each element is read, then written, by the same thread).
template <bool kGelu>
__global__ void column_partials_kernel(const void* pre, bool pre_bf16, const float* bias,
                                       const void* src, bool src_bf16, float* dpre,
                                       uint16_t* dpre_bf16, float* partial,
                                       int64_t partial_stride, const RowTable table,
                                       int64_t cols) {
  __shared__ float tile[kRowThreads][kColTile + 1];
  const int64_t e = blockIdx.z;
  const int64_t rows = table.rows[e];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColumnSumChunkRows;
  if (r0 >= rows) return;  // the whole block: no thread reaches the barriers below
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r1 = r0 + kColumnSumChunkRows < rows ? r0 + kColumnSumChunkRows : rows;
  const int64_t base = table.at[e];
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const int64_t i = base + r * cols + col;
      float v = load(src, src_bf16, i);
      if constexpr (kGelu) {
        v = expert_math::gelu_grad(load(pre, pre_bf16, i) + bias[e * cols + col]) * v;
        if (dpre != nullptr) dpre[i] = v;
        if (dpre_bf16 != nullptr) dpre_bf16[i] = expert_math::f32_to_bf16(v);
      }
      sum += v;
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s)
      tile[threadIdx.y][threadIdx.x] += tile[threadIdx.y + s][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < cols)
    partial[e * partial_stride + static_cast<int64_t>(blockIdx.y) * cols + col] =
        tile[0][threadIdx.x];
}

// out[e] (cols) += the chunk partials of each column of expert e = block y, in chunk order.
__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t partial_stride,
                                     const RowTable table, int64_t cols, float* __restrict__ out) {
  const int64_t e = blockIdx.y;
  const int64_t chunks = (table.rows[e] + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  for (int64_t c = thread_index(); c < cols; c += thread_stride()) {
    float s = 0.0f;
    for (int64_t j = 0; j < chunks; ++j) s += partial[e * partial_stride + j * cols + c];
    out[e * cols + c] += s;
  }
}

// Calls launch(table, first, num, most) for each launch's experts [first, first + num):
// table = their row counts and first elements, most = the largest count.
template <class Launch>
void for_expert_launches(const ExpertRows& r, Launch&& launch) {
  for (int64_t first = 0; first < r.experts; first += kMaxExpertsPerLaunch) {
    const int64_t num = std::min<int64_t>(kMaxExpertsPerLaunch, r.experts - first);
    RowTable table{};
    int64_t most = 0;
    for (int64_t e = 0; e < num; ++e) {
      const int64_t rows = r.rows[first + e];
      table.rows[e] = static_cast<int32_t>(rows);
      table.at[e] = r.at != nullptr ? r.at[first + e] : (first + e) * r.stride;
      most = std::max(most, rows);
    }
    if (most > 0 && r.cols > 0) launch(table, first, num, most);
  }
}

void column_sums(Values pre, const float* bias, Values src, float* dpre, uint16_t* dpre_bf16,
                 float* dbias, float* scratch, const ExpertRows& r, bool gelu) {
  const int64_t cols = r.cols;
  for_expert_launches(r, [&](const RowTable& table, int64_t first, int64_t num, int64_t most) {
    const int64_t chunks = (most + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
    const int64_t partial_stride = chunks * cols;
    const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile),
                    static_cast<unsigned>(chunks), static_cast<unsigned>(num));
    const dim3 block(kColTile, kRowThreads);
    cudaStream_t s = stream();
    if (gelu)
      column_partials_kernel<true><<<grid, block, 0, s>>>(
          pre.data, pre.bf16, bias + first * cols, src.data, src.bf16, dpre, dpre_bf16, scratch,
          partial_stride, table, cols);
    else
      column_partials_kernel<false><<<grid, block, 0, s>>>(nullptr, false, nullptr, src.data,
                                                           src.bf16, nullptr, nullptr, scratch,
                                                           partial_stride, table, cols);
    PARM_CUDA_CHECK_LAUNCH();
    const dim3 finish(std::min<unsigned>(grid_for(cols), 64u), static_cast<unsigned>(num));
    column_finish_kernel<<<finish, kThreads, 0, s>>>(scratch, partial_stride, table, cols,
                                                     dbias + first * cols);
    PARM_CUDA_CHECK_LAUNCH();
  });
}

struct SegmentTable {
  SegmentCopy seg[kMaxSegmentsPerLaunch];
};
static_assert(sizeof(SegmentTable) <= 4000, "kernel arguments are limited to 4 KiB");

// Block y does segment y of the table. kVec4: every pointer is 16-byte aligned (8 for the
// bf16 ones) and every count (and cols, with a bias) a multiple of 4, so the segment moves
// four values at a time.
template <bool kVec4>
__global__ void copy_segments_kernel(const SegmentTable table) {
  const SegmentCopy s = table.seg[blockIdx.y];
  if constexpr (kVec4) {
    const int64_t copy4 = s.copy / 4;
    const int64_t total4 = (s.copy + s.zero) / 4;
    float4* dst = reinterpret_cast<float4*>(s.dst);
    uint2* dst_bf16 = reinterpret_cast<uint2*>(s.dst_bf16);
    for (int64_t i = thread_index(); i < total4; i += thread_stride()) {
      if (i < copy4) {
        float4 v;
        if (s.src_bf16 != nullptr) {
          const uint2 h = reinterpret_cast<const uint2*>(s.src_bf16)[i];
          v.x = expert_math::bf16_to_f32(static_cast<uint16_t>(h.x & 0xffffu));
          v.y = expert_math::bf16_to_f32(static_cast<uint16_t>(h.x >> 16));
          v.z = expert_math::bf16_to_f32(static_cast<uint16_t>(h.y & 0xffffu));
          v.w = expert_math::bf16_to_f32(static_cast<uint16_t>(h.y >> 16));
        } else {
          v = reinterpret_cast<const float4*>(s.src)[i];
        }
        if (s.bias != nullptr) {
          const float4 b = reinterpret_cast<const float4*>(s.bias)[(4 * i % s.cols) / 4];
          v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
        }
        if (dst != nullptr) dst[i] = v;
        if (dst_bf16 != nullptr) {
          uint2 packed;  // little-endian: the lower half is the lower address
          packed.x = static_cast<uint32_t>(expert_math::f32_to_bf16(v.x)) |
                     (static_cast<uint32_t>(expert_math::f32_to_bf16(v.y)) << 16);
          packed.y = static_cast<uint32_t>(expert_math::f32_to_bf16(v.z)) |
                     (static_cast<uint32_t>(expert_math::f32_to_bf16(v.w)) << 16);
          dst_bf16[i] = packed;
        }
      } else if (dst != nullptr) {
        dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  } else {
    const int64_t total = s.copy + s.zero;
    for (int64_t i = thread_index(); i < total; i += thread_stride()) {
      if (i < s.copy) {
        float v = s.src_bf16 != nullptr ? expert_math::bf16_to_f32(s.src_bf16[i]) : s.src[i];
        if (s.bias != nullptr) v += s.bias[i % s.cols];
        if (s.dst != nullptr) s.dst[i] = v;
        if (s.dst_bf16 != nullptr) s.dst_bf16[i] = expert_math::f32_to_bf16(v);
      } else if (s.dst != nullptr) {
        s.dst[i] = 0.0f;
      }
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

constexpr int kMaxPointersPerLaunch = 128;
struct PointerTable {
  const void* p[kMaxPointersPerLaunch];
};

__global__ void store_pointers_kernel(const PointerTable table, int count, void** device) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < count) device[i] = const_cast<void*>(table.p[i]);
}

}  // namespace

ExpertRows one_expert(const int64_t* rows, int64_t cols) {
  ExpertRows r;
  r.rows = rows;
  r.experts = 1;
  r.stride = *rows * cols;
  r.cols = cols;
  return r;
}

void bias_gelu(Values pre, const float* bias, float* act, uint16_t* act_bf16, const ExpertRows& r) {
  for_expert_launches(r, [&](const RowTable& table, int64_t first, int64_t num, int64_t most) {
    const int64_t n = most * r.cols;
    const dim3 grid(std::min<unsigned>(grid_for(n), 4096u), static_cast<unsigned>(num));
    const float* b = bias + first * r.cols;
    if (fits_u32(n))
      bias_gelu_kernel<uint32_t><<<grid, kThreads, 0, stream()>>>(
          pre.data, pre.bf16, b, act, act_bf16, table, static_cast<uint32_t>(r.cols));
    else
      bias_gelu_kernel<int64_t>
          <<<grid, kThreads, 0, stream()>>>(pre.data, pre.bf16, b, act, act_bf16, table, r.cols);
    PARM_CUDA_CHECK_LAUNCH();
  });
}

void bias_gelu_backward(Values pre, const float* bias, Values dact, float* dpre,
                        uint16_t* dpre_bf16, float* dbias, float* scratch, const ExpertRows& r) {
  column_sums(pre, bias, dact, dpre, dpre_bf16, dbias, scratch, r, true);
}

void bias_backward(const float* dy, float* dbias, float* scratch, const ExpertRows& r) {
  column_sums(Values{}, nullptr, f32_values(dy), nullptr, nullptr, dbias, scratch, r, false);
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, y, n);
  PARM_CUDA_CHECK_LAUNCH();
}

void fill_pattern(float* x, int64_t n) {
  if (n <= 0) return;
  fill_pattern_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, n);
  PARM_CUDA_CHECK_LAUNCH();
}

void copy_segments(const SegmentCopy* segments, int64_t count) {
  for (int64_t first = 0; first < count; first += kMaxSegmentsPerLaunch) {
    const int64_t num = std::min<int64_t>(kMaxSegmentsPerLaunch, count - first);
    SegmentTable table{};
    bool vec4 = true;
    int64_t longest = 0;
    for (int64_t i = 0; i < num; ++i) {
      const SegmentCopy& s = segments[first + i];
      table.seg[i] = s;
      longest = std::max(longest, s.copy + s.zero);
      vec4 = vec4 && s.copy % 4 == 0 && s.zero % 4 == 0 && aligned(s.src, 16) &&
             aligned(s.src_bf16, 8) && aligned(s.dst, 16) && aligned(s.dst_bf16, 8) &&
             (s.bias == nullptr || (s.cols % 4 == 0 && aligned(s.bias, 16)));
    }
    if (longest == 0) continue;
    const int64_t work = vec4 ? longest / 4 : longest;
    const dim3 grid(std::min<unsigned>(grid_for(work), 1024u), static_cast<unsigned>(num));
    if (vec4)
      copy_segments_kernel<true><<<grid, kThreads, 0, stream()>>>(table);
    else
      copy_segments_kernel<false><<<grid, kThreads, 0, stream()>>>(table);
    PARM_CUDA_CHECK_LAUNCH();
  }
}

void store_pointers(const void* const* host, int64_t count, void** device) {
  for (int64_t first = 0; first < count; first += kMaxPointersPerLaunch) {
    const int num = static_cast<int>(std::min<int64_t>(kMaxPointersPerLaunch, count - first));
    PointerTable table{};
    for (int i = 0; i < num; ++i) table.p[i] = host[first + i];
    store_pointers_kernel<<<1, kMaxPointersPerLaunch, 0, stream()>>>(table, num, device + first);
    PARM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace parm::cuda
