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

// The elementwise bias kernels find an element's column with a modulo; Index is uint32_t
// whenever the indices fit (a 64-bit modulo costs several times more on the GPU).
template <class Index>
__global__ void bias_gelu_kernel(const float* __restrict__ pre, const float* __restrict__ bias,
                                 float* __restrict__ act, uint16_t* __restrict__ act_bf16, Index n,
                                 Index cols) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float a = expert_math::gelu(pre[i] + bias[i % cols]);
    act[i] = a;
    if (act_bf16 != nullptr) act_bf16[i] = expert_math::f32_to_bf16(a);
  }
}

template <class Index>
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, Index n,
                                Index cols) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] += bias[i % cols];
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

// partial (chunks, cols): the sum of each column over one chunk of kColumnSumChunkRows rows
// (block y = chunk): every thread sums rows y, y + kRowThreads, ... of its column in order,
// then a fixed tree adds the kRowThreads sums. kGelu: the summed values are
// dpre = gelu'(pre + bias) * src, written to dpre (and dpre_bf16) on the way (dpre may be
// src: each element is read, then written, by the same thread).
template <bool kGelu>
__global__ void column_partials_kernel(const float* pre, const float* bias, const float* src,
                                       float* dpre, uint16_t* dpre_bf16, float* partial,
                                       int64_t rows, int64_t cols) {
  __shared__ float tile[kRowThreads][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColumnSumChunkRows;
  const int64_t r1 = r0 + kColumnSumChunkRows < rows ? r0 + kColumnSumChunkRows : rows;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const int64_t i = r * cols + col;
      float v = src[i];
      if constexpr (kGelu) {
        v = expert_math::gelu_grad(pre[i] + bias[col]) * v;
        dpre[i] = v;
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
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = tile[0][threadIdx.x];
}

// out (cols) += the chunk partials of each column, added in chunk order.
__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t chunks,
                                     int64_t cols, float* __restrict__ out) {
  for (int64_t c = thread_index(); c < cols; c += thread_stride()) {
    float s = 0.0f;
    for (int64_t j = 0; j < chunks; ++j) s += partial[j * cols + c];
    out[c] += s;
  }
}

void column_sums(const float* pre, const float* bias, const float* src, float* dpre,
                 uint16_t* dpre_bf16, float* dbias, float* scratch, int64_t rows, int64_t cols,
                 bool gelu) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  const dim3 block(kColTile, kRowThreads);
  cudaStream_t s = stream();
  if (gelu)
    column_partials_kernel<true>
        <<<grid, block, 0, s>>>(pre, bias, src, dpre, dpre_bf16, scratch, rows, cols);
  else
    column_partials_kernel<false>
        <<<grid, block, 0, s>>>(nullptr, nullptr, src, nullptr, nullptr, scratch, rows, cols);
  PARM_CUDA_CHECK_LAUNCH();
  column_finish_kernel<<<grid_for(cols), kThreads, 0, s>>>(scratch, chunks, cols, dbias);
  PARM_CUDA_CHECK_LAUNCH();
}

struct SegmentTable {
  SegmentCopy seg[kMaxSegmentsPerLaunch];
};
static_assert(sizeof(SegmentTable) <= 4000, "kernel arguments are limited to 4 KiB");

// Block y does segment y of the table. kVec4: every pointer is 16-byte aligned (8 for the
// bf16 one) and every count a multiple of 4, so the segment moves as float4.
template <bool kVec4>
__global__ void copy_segments_kernel(const SegmentTable table) {
  const SegmentCopy s = table.seg[blockIdx.y];
  if constexpr (kVec4) {
    const int64_t copy4 = s.copy / 4;
    const int64_t total4 = (s.copy + s.zero) / 4;
    const float4* src = reinterpret_cast<const float4*>(s.src);
    float4* dst = reinterpret_cast<float4*>(s.dst);
    uint2* dst_bf16 = reinterpret_cast<uint2*>(s.dst_bf16);
    for (int64_t i = thread_index(); i < total4; i += thread_stride()) {
      if (i < copy4) {
        const float4 v = src[i];
        dst[i] = v;
        if (dst_bf16 != nullptr) {
          uint2 packed;  // little-endian: the lower half is the lower address
          packed.x = static_cast<uint32_t>(expert_math::f32_to_bf16(v.x)) |
                     (static_cast<uint32_t>(expert_math::f32_to_bf16(v.y)) << 16);
          packed.y = static_cast<uint32_t>(expert_math::f32_to_bf16(v.z)) |
                     (static_cast<uint32_t>(expert_math::f32_to_bf16(v.w)) << 16);
          dst_bf16[i] = packed;
        }
      } else {
        dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  } else {
    const int64_t total = s.copy + s.zero;
    for (int64_t i = thread_index(); i < total; i += thread_stride()) {
      if (i < s.copy) {
        const float v = s.src[i];
        s.dst[i] = v;
        if (s.dst_bf16 != nullptr) s.dst_bf16[i] = expert_math::f32_to_bf16(v);
      } else {
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

void bias_gelu(const float* pre, const float* bias, float* act, uint16_t* act_bf16, int64_t rows,
               int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (fits_u32(n))
    bias_gelu_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream()>>>(
        pre, bias, act, act_bf16, static_cast<uint32_t>(n), static_cast<uint32_t>(cols));
  else
    bias_gelu_kernel<int64_t>
        <<<grid_for(n), kThreads, 0, stream()>>>(pre, bias, act, act_bf16, n, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void bias_gelu_backward(const float* pre, const float* bias, const float* dact, float* dpre,
                        uint16_t* dpre_bf16, float* dbias, float* scratch, int64_t rows,
                        int64_t cols) {
  column_sums(pre, bias, dact, dpre, dpre_bf16, dbias, scratch, rows, cols, true);
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (fits_u32(n))
    add_bias_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream()>>>(
        y, bias, static_cast<uint32_t>(n), static_cast<uint32_t>(cols));
  else
    add_bias_kernel<int64_t><<<grid_for(n), kThreads, 0, stream()>>>(y, bias, n, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void bias_backward(const float* dy, float* dbias, float* scratch, int64_t rows, int64_t cols) {
  column_sums(nullptr, nullptr, dy, nullptr, nullptr, dbias, scratch, rows, cols, false);
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
             aligned(s.dst, 16) && aligned(s.dst_bf16, 8);
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
