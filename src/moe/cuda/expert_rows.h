// The row bookkeeping of the device experts, header-only and free of CUDA so that the CPU
// unit tests check it: the fill counts of the exchange layout (blocks, E_loc, slots, M), and
// the contiguous copies that gather each expert's filled rows out of it and scatter them
// back (moe_ops.h: expert e's rows in block b are the first fills[b * E_loc + e] slots of
// segment [b, e]; the rest are empty slots).
//
// Packed rows: expert e's filled rows, blocks in order, start at packed + packed_at[e]
// (elements; expert_row_offsets); they are what the expert's GEMMs read and write (the
// grouped products' row layout).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/expert_kernels.h"
#include "parm/host_device.h"
#include "parm/error.h"

namespace parm::moe::cuda {

// Throws unless every fill count is in [0, slots].
inline void check_fills(const int32_t* fills, int64_t blocks, int64_t e_loc, int64_t slots) {
  for (int64_t i = 0; i < blocks * e_loc; ++i)
    PARM_CHECK(fills[i] >= 0 && fills[i] <= slots,
               "expert segment {} has fill count {}, outside [0, {}] (corrupt routing counts)", i,
               fills[i], slots);
}

// rows[e] = sum over blocks of fills[b * e_loc + e]. Overwrites rows (resized to e_loc).
inline void count_rows(const int32_t* fills, int64_t blocks, int64_t e_loc,
                       std::vector<int64_t>& rows) {
  rows.assign(static_cast<size_t>(e_loc), 0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t e = 0; e < e_loc; ++e) rows[static_cast<size_t>(e)] += fills[b * e_loc + e];
}

// Elements between two experts' blocks of packed rows (max_rows rows of cols values each):
// rounded up to kExpertBlockAlign elements, so every expert's block starts 128-byte aligned
// in bf16 and 256-byte aligned in fp32 (when the buffer does), the alignment cuBLAS's
// tensor-core kernels want of their operands.
inline constexpr int64_t kExpertBlockAlign = 64;
PARM_HD inline int64_t expert_block_stride(int64_t max_rows, int64_t cols) {
  const int64_t n = max_rows * cols;
  return (n + kExpertBlockAlign - 1) / kExpertBlockAlign * kExpertBlockAlign;
}

// Where each expert's rows (rows[e] of them, cols values each) start in a workspace row
// buffer, in elements from its start: at[e] for e in [0, experts). Every reader of the
// workspace (gather, scatter, grouped products, row kernels) takes these offsets.
// - Blocks (pooled false; a capacity factor): at[e] = e * block_stride, each expert its own
//   block of the most rows it can get (block_stride = expert_block_stride(max_rows, cols)).
// - Pooled (dropless): one pool, expert e's rows after those of the experts before it, at row
//   rows[0] + ... + rows[e - 1] (the CPU backend's ExpertWorkspace::first[e]) times cols, each
//   expert's rows rounded up to kExpertBlockAlign elements so that every expert starts as
//   aligned as a block does (the same row when cols is a multiple of kExpertBlockAlign).
// Returns the elements taken: the end of the last expert's (aligned) rows in the pool, or
// experts * block_stride.
PARM_HD inline int64_t expert_row_offsets(const int64_t* rows, int64_t experts, int64_t cols,
                                          bool pooled, int64_t block_stride, int64_t* at) {
  int64_t next = 0;
  for (int64_t e = 0; e < experts; ++e) {
    at[e] = next;
    next += pooled ? expert_block_stride(rows[e], cols) : block_stride;
  }
  return next;
}

// Elements of a pool that holds any rows of `experts` experts adding up to at most
// max_total_rows (expert_row_offsets, pooled): the rows plus each expert's alignment.
PARM_HD inline int64_t expert_pool_elements(int64_t max_total_rows, int64_t experts,
                                            int64_t cols) {
  return expert_block_stride(max_total_rows, cols) + experts * (kExpertBlockAlign - 1);
}

// Offset (elements) of segment [b, e]'s first row in the layout: at (b * E_loc + e) slots
// rows, or, with `first` (dropless, packed: shape/packed_rows.h), at row first[b * E_loc + e].
PARM_HD inline int64_t segment_offset(int64_t b, int64_t e, int64_t e_loc, int64_t slots,
                                      int64_t M, const int64_t* first = nullptr) {
  const int64_t i = b * e_loc + e;
  return (first != nullptr ? first[i] : i * slots) * M;
}

// Rows of segment [b, e] a scatter zeroes after its f filled ones: the empty slots, none in
// the packed layout (its segments hold their filled rows only).
PARM_HD inline int64_t segment_empty_rows(int64_t slots, int64_t f, const int64_t* first) {
  return first != nullptr ? 0 : slots - f;
}

// Throws unless every packed segment [first[i], first[i] + fills[i]) lies in a buffer of
// `rows` rows.
inline void check_starts(const int32_t* fills, const int64_t* first, int64_t segments,
                         int64_t rows) {
  for (int64_t i = 0; i < segments; ++i)
    PARM_CHECK(first[i] >= 0 && first[i] + fills[i] <= rows,
               "expert segment {} starts at row {} with {} rows, outside the buffer's {} rows "
               "(corrupt packed starts)",
               i, first[i], fills[i], rows);
}

// The gather: emit(SegmentCopy) for every non-empty segment, copying its filled rows from
// `layout` (segments at segment_offset(..., first); first may be null) to expert e's packed
// rows, at packed_at[e] (expert_row_offsets), in fp32 (packed) and bf16 (packed_bf16), each
// when not null (same offsets).
template <class Emit>
void plan_gather(const float* layout, int64_t blocks, int64_t e_loc, int64_t slots, int64_t M,
                 const int32_t* fills, const int64_t* first, float* packed,
                 uint16_t* packed_bf16, const int64_t* packed_at, Emit&& emit) {
  for (int64_t e = 0; e < e_loc; ++e) {
    int64_t n = 0;  // rows of expert e so far
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t f = fills[b * e_loc + e];
      if (f > 0) {
        const int64_t dst = packed_at[e] + n * M;
        parm::cuda::SegmentCopy s;
        s.src = layout + segment_offset(b, e, e_loc, slots, M, first);
        s.dst = packed != nullptr ? packed + dst : nullptr;
        s.dst_bf16 = packed_bf16 != nullptr ? packed_bf16 + dst : nullptr;
        s.copy = f * M;
        s.zero = 0;
        emit(s);
      }
      n += f;
    }
  }
}

// The scatter: emit(SegmentCopy) for every segment with rows to write, copying expert e's
// packed rows at packed_at[e] (fp32 packed, or bf16 packed_bf16 when that is not null) plus
// bias + e * M (when bias, (E_loc, M), is not null) into its filled slots and zeroing the
// empty ones, so the whole layout is written; with `first` (packed layout) its segments'
// rows, which are all filled.
template <class Emit>
void plan_scatter(const float* packed, const uint16_t* packed_bf16, const int64_t* packed_at,
                  const float* bias, int64_t blocks, int64_t e_loc, int64_t slots, int64_t M,
                  const int32_t* fills, const int64_t* first, float* layout, Emit&& emit) {
  if (slots * M == 0) return;
  for (int64_t e = 0; e < e_loc; ++e) {
    int64_t n = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t f = fills[b * e_loc + e];
      parm::cuda::SegmentCopy s;
      const int64_t src = packed_at[e] + n * M;
      if (packed_bf16 != nullptr)
        s.src_bf16 = packed_bf16 + src;
      else
        s.src = packed + src;
      s.bias = bias != nullptr ? bias + e * M : nullptr;
      s.cols = M;
      s.dst = layout + segment_offset(b, e, e_loc, slots, M, first);
      s.dst_bf16 = nullptr;
      s.copy = f * M;
      s.zero = segment_empty_rows(slots, f, first) * M;
      if (s.copy + s.zero > 0) emit(s);
      n += f;
    }
  }
}

}  // namespace parm::moe::cuda
