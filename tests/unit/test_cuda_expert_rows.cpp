// The row bookkeeping of the device experts (moe/cuda/expert_rows.h) on the CPU: the
// segment copies that gather each expert's filled rows out of the exchange layout and
// scatter them back, run here by a host emulation of the copy kernel, must give exactly the
// rows the layout contract names (moe_ops.h), write nothing else on a gather and every
// element on a scatter (zeros at empty slots). In the packed layout of dropless routing the
// segments start at parm::packed_starts of the fills (the CPU backend's numbering): the same
// rows, and a scatter writes the routed rows and nothing else.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/expert_math.h"
#include "shape/packed_rows.h"
#include "moe/cuda/expert_rows.h"
#include "moe/moe_ops.h"
#include "parm/error.h"

namespace parm::moe::cuda {
namespace {

constexpr float kSentinel = -12345.0f;

using parm::cuda::expert_math::bf16_to_f32;
using parm::cuda::expert_math::f32_to_bf16;

// What parm::cuda::copy_segments does (expert_kernels.h), on host memory.
void apply(const parm::cuda::SegmentCopy& s) {
  ASSERT_TRUE((s.src == nullptr) != (s.src_bf16 == nullptr)) << "one source";
  ASSERT_TRUE(s.bias == nullptr || s.cols > 0);
  for (int64_t i = 0; i < s.copy; ++i) {
    float v = s.src_bf16 != nullptr ? bf16_to_f32(s.src_bf16[i]) : s.src[i];
    if (s.bias != nullptr) v += s.bias[i % s.cols];
    if (s.dst != nullptr) s.dst[i] = v;
    if (s.dst_bf16 != nullptr) s.dst_bf16[i] = f32_to_bf16(v);
  }
  if (s.dst != nullptr)
    for (int64_t i = s.copy; i < s.copy + s.zero; ++i) s.dst[i] = 0.0f;
}

// Value of layout element (b, e, slot, c): names its position.
float layout_value(int64_t b, int64_t e, int64_t slot, int64_t c) {
  return static_cast<float>(1000 * b + 100 * e + 10 * slot + c) + 0.5f;
}

struct Layout {
  int64_t blocks, e_loc, slots, M;
  std::vector<int32_t> fills;  // (blocks, e_loc)
};

// packed_layout: the exchange layout's segments back to back (first); pooled: the experts'
// packed rows in one pool (expert_row_offsets) instead of a block of `stride` each.
void check_gather_and_scatter(const Layout& l, bool packed_layout, bool pooled) {
  const int64_t max_rows = l.blocks * l.slots;
  const int64_t stride = max_rows * l.M + 3;  // not the tight stride: offsets must use it
  // Packed: segment i at the CPU's packed_starts, and two spare rows past the routed ones.
  const int64_t segments = l.blocks * l.e_loc;
  std::vector<int64_t> starts(static_cast<size_t>(segments));
  const int64_t routed = packed_starts(l.fills.data(), segments, starts.data());
  const int64_t* first = packed_layout ? starts.data() : nullptr;
  const int64_t layout_rows = packed_layout ? routed + 2 : segments * l.slots;
  // Slots of segment [b, e] the layout holds: all of them, or packed its filled ones.
  auto held = [&](int64_t b, int64_t e) {
    return packed_layout ? int64_t{l.fills[static_cast<size_t>(b * l.e_loc + e)]} : l.slots;
  };
  std::vector<float> layout(static_cast<size_t>(layout_rows * l.M), kSentinel);
  for (int64_t b = 0; b < l.blocks; ++b)
    for (int64_t e = 0; e < l.e_loc; ++e)
      for (int64_t s = 0; s < held(b, e); ++s)
        for (int64_t c = 0; c < l.M; ++c)
          layout[static_cast<size_t>(segment_offset(b, e, l.e_loc, l.slots, l.M, first) +
                                     s * l.M + c)] = layout_value(b, e, s, c);
  for (int64_t i = 0; i < (packed_layout ? routed : layout_rows) * l.M; ++i)
    ASSERT_NE(layout[static_cast<size_t>(i)], kSentinel) << "rows overlap or leave a gap at " << i;

  std::vector<int64_t> rows;
  count_rows(l.fills.data(), l.blocks, l.e_loc, rows);
  ASSERT_EQ(static_cast<int64_t>(rows.size()), l.e_loc);

  // Gather: expert e's packed row n is the n-th filled row in block order, at at[e]; nothing
  // else of the packed buffers is written.
  std::vector<int64_t> at(static_cast<size_t>(l.e_loc));
  const int64_t used = expert_row_offsets(rows.data(), l.e_loc, l.M, pooled, stride, at.data());
  const int64_t elements = pooled ? expert_pool_elements(routed, l.e_loc, l.M) : l.e_loc * stride;
  ASSERT_LE(used, elements);
  std::vector<float> packed(static_cast<size_t>(elements), kSentinel);
  std::vector<uint16_t> packed_bf16(packed.size(), 0xdead);
  std::vector<char> expert_rows_here(packed.size(), 0);  // 1 where an expert's rows lie
  int emitted = 0;
  plan_gather(layout.data(), l.blocks, l.e_loc, l.slots, l.M, l.fills.data(), first,
              packed.data(), packed_bf16.data(), at.data(), [&](const parm::cuda::SegmentCopy& s) {
                EXPECT_GT(s.copy, 0);
                EXPECT_EQ(s.zero, 0);
                apply(s);
                ++emitted;
              });
  int nonempty = 0;
  for (int32_t f : l.fills) nonempty += f > 0;
  EXPECT_EQ(emitted, nonempty);
  for (int64_t e = 0; e < l.e_loc; ++e) {
    int64_t n = 0;
    int64_t total = 0;
    for (int64_t b = 0; b < l.blocks; ++b) total += l.fills[static_cast<size_t>(b * l.e_loc + e)];
    EXPECT_EQ(rows[static_cast<size_t>(e)], total);
    for (int64_t b = 0; b < l.blocks; ++b)
      for (int64_t s = 0; s < l.fills[static_cast<size_t>(b * l.e_loc + e)]; ++s, ++n)
        for (int64_t c = 0; c < l.M; ++c) {
          const size_t i = static_cast<size_t>(at[static_cast<size_t>(e)] + n * l.M + c);
          ASSERT_EQ(expert_rows_here[i], 0) << "experts' rows overlap at " << i;
          expert_rows_here[i] = 1;
          ASSERT_EQ(packed[i], layout_value(b, e, s, c)) << "e=" << e << " b=" << b << " s=" << s;
          ASSERT_EQ(packed_bf16[i], f32_to_bf16(layout_value(b, e, s, c)));
        }
  }
  for (size_t i = 0; i < packed.size(); ++i)
    if (expert_rows_here[i] == 0) {
      ASSERT_EQ(packed[i], kSentinel) << "i=" << i;
      ASSERT_EQ(packed_bf16[i], 0xdead) << "i=" << i;
    }

  // A bf16-only gather (the forward pass at bf16) writes the same bf16 rows and no fp32.
  std::vector<uint16_t> only_bf16(packed.size(), 0xdead);
  plan_gather(layout.data(), l.blocks, l.e_loc, l.slots, l.M, l.fills.data(), first, nullptr,
              only_bf16.data(), at.data(), [&](const parm::cuda::SegmentCopy& s) {
                EXPECT_EQ(s.dst, nullptr);
                apply(s);
              });
  EXPECT_EQ(only_bf16, packed_bf16);

  // Scatter back into a layout full of sentinels: filled rows come back where they were (plus
  // the expert's bias, from the fp32 or the bf16 rows), every empty slot is zero, and no
  // element keeps its sentinel; packed, the spare rows past the routed ones keep theirs.
  std::vector<float> bias(static_cast<size_t>(l.e_loc * l.M));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i + 1);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "fp32 rows" : variant == 1 ? "fp32 rows + bias" : "bf16 + bias");
    const bool from_bf16 = variant == 2, with_bias = variant > 0;
    std::vector<float> back(layout.size(), kSentinel);
    plan_scatter(from_bf16 ? nullptr : packed.data(), from_bf16 ? packed_bf16.data() : nullptr,
                 at.data(), with_bias ? bias.data() : nullptr, l.blocks, l.e_loc, l.slots, l.M,
                 l.fills.data(), first, back.data(), [&](const parm::cuda::SegmentCopy& s) {
                   EXPECT_EQ(s.dst_bf16, nullptr);
                   if (packed_layout)
                     EXPECT_EQ(s.zero, 0);
                   else
                     EXPECT_EQ(s.copy + s.zero, l.slots * l.M);
                   apply(s);
                 });
    for (int64_t i = routed * l.M; packed_layout && i < layout_rows * l.M; ++i)
      ASSERT_EQ(back[static_cast<size_t>(i)], kSentinel) << "spare element " << i;
    for (int64_t b = 0; b < l.blocks; ++b)
      for (int64_t e = 0; e < l.e_loc; ++e)
        for (int64_t s = 0; s < held(b, e); ++s)
          for (int64_t c = 0; c < l.M; ++c) {
            float want = 0.0f;
            if (s < l.fills[static_cast<size_t>(b * l.e_loc + e)]) {
              const float v = layout_value(b, e, s, c);
              want = from_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
              if (with_bias) want += bias[static_cast<size_t>(e * l.M + c)];
            }
            ASSERT_EQ(back[static_cast<size_t>(
                          segment_offset(b, e, l.e_loc, l.slots, l.M, first) + s * l.M + c)],
                      want)
                << "b=" << b << " e=" << e << " s=" << s << " c=" << c;
          }
  }
}

// check_gather_and_scatter of every layout, with a block per expert and pooled.
template <size_t N>
void check_layouts(const Layout (&layouts)[N], bool packed_layout) {
  for (const Layout& l : layouts)
    for (bool pooled : {false, true}) {
      SCOPED_TRACE(testing::Message() << (packed_layout ? "packed " : "") << "blocks=" << l.blocks
                                      << " E_loc=" << l.e_loc << " slots=" << l.slots
                                      << " M=" << l.M << (pooled ? " pooled" : " blocks"));
      check_gather_and_scatter(l, packed_layout, pooled);
    }
}

TEST(CudaExpertRows, GatherAndScatterFollowTheLayout) {
  const Layout layouts[] = {
      {1, 1, 4, 3, {2}},
      {1, 1, 4, 3, {4}},
      {1, 1, 4, 3, {0}},
      {2, 3, 5, 2, {5, 0, 2, 3, 0, 5}},  // expert 1 has no rows at all
      {3, 2, 4, 5, {0, 4, 1, 0, 4, 3}},
      {4, 1, 2, 1, {1, 2, 0, 2}},
      {2, 2, 3, 4, {0, 0, 0, 0}},
  };
  check_layouts(layouts, false);
}

// Dropless, packed: the segments back to back at the CPU's starts, on skewed fills (one
// expert taking every slot of a block, segments and whole experts with none).
TEST(CudaExpertRows, PackedGatherAndScatterReadTheCpuStarts) {
  const Layout layouts[] = {
      {1, 1, 4, 3, {2}},
      {2, 3, 5, 2, {5, 0, 2, 3, 0, 5}},
      {3, 2, 4, 5, {0, 4, 1, 0, 4, 3}},
      {4, 2, 3, 2, {3, 0, 3, 0, 0, 0, 3, 0}},  // expert 0 takes everything, expert 1 nothing
      {2, 4, 6, 3, {0, 0, 6, 0, 1, 0, 0, 2}},
      {2, 2, 3, 4, {0, 0, 0, 0}},
  };
  check_layouts(layouts, true);
}

TEST(CudaExpertRows, PackedStartsOutsideTheBufferAreRefused) {
  const std::vector<int32_t> fills = {2, 0, 3};
  const std::vector<int64_t> ok = {0, 2, 2};
  EXPECT_NO_THROW(check_starts(fills.data(), ok.data(), 3, 5));
  EXPECT_THROW(check_starts(fills.data(), ok.data(), 3, 4), parm::Error);
  const std::vector<int64_t> negative = {-1, 2, 2};
  EXPECT_THROW(check_starts(fills.data(), negative.data(), 3, 5), parm::Error);
}

TEST(CudaExpertRows, ScatterOfZeroSlotsEmitsNothing) {
  const std::vector<int32_t> fills = {0, 0};
  int emitted = 0;
  const std::vector<int64_t> at = {0, 0};
  plan_scatter(nullptr, nullptr, at.data(), nullptr, 1, 2, 0, 8, fills.data(), nullptr, nullptr,
               [&](const parm::cuda::SegmentCopy&) { ++emitted; });
  EXPECT_EQ(emitted, 0);
}

// Every expert's block of packed rows starts kExpertBlockAlign-aligned (16-byte aligned in
// bf16 needs 8 elements; the stride gives 64), holds its max_rows rows, and the blocks do not
// overlap.
TEST(CudaExpertRows, ExpertBlocksAreAlignedAndHoldTheirRows) {
  const int64_t cases[][2] = {{0, 8}, {1, 1}, {1, 7}, {3, 5}, {17, 1024}, {300, 2050}, {7, 64}};
  for (const auto& c : cases) {
    const int64_t rows = c[0], cols = c[1];
    const int64_t stride = expert_block_stride(rows, cols);
    EXPECT_EQ(stride % kExpertBlockAlign, 0) << rows << " x " << cols;
    EXPECT_GE(stride, rows * cols) << rows << " x " << cols;
    EXPECT_LT(stride, rows * cols + kExpertBlockAlign) << rows << " x " << cols;
  }
  EXPECT_EQ(expert_block_stride(2, 3), 64);
  EXPECT_EQ(expert_block_stride(64, 1), 64);
  EXPECT_EQ(expert_block_stride(65, 1), 128);
  static_assert(kExpertBlockAlign * sizeof(uint16_t) % 16 == 0, "16-byte bf16 blocks");
}

// Dropless: the GPU workspace pool puts expert e's rows where the CPU backend's
// ExpertWorkspace does (first[e] = the rows of the experts before it), on skewed fills (one
// expert taking every row, experts with none): the same element when the row width is a
// multiple of kExpertBlockAlign, otherwise no more than the alignment of the experts before
// it further on; aligned, not overlapping, inside expert_pool_elements of the CPU's bound.
// With a capacity factor every expert keeps its block at e * stride (the addresses the
// experts had before the pool).
TEST(CudaExpertRows, PooledOffsetsAreTheCpuWorkspaceStarts) {
  struct Case {
    int64_t blocks, e_loc, slots;
    std::vector<int32_t> fills;  // (blocks, e_loc)
  };
  const Case cases[] = {
      {1, 1, 4, {3}},
      {2, 3, 5, {5, 0, 2, 3, 0, 5}},
      {2, 4, 6, {0, 6, 0, 0, 0, 6, 0, 0}},           // expert 1 takes every row, the rest none
      {3, 4, 3, {3, 0, 1, 2, 0, 0, 3, 3, 1, 0, 0, 3}},
      {2, 3, 4, {0, 0, 4, 0, 0, 4}},                 // only the last expert
      {2, 2, 3, {0, 0, 0, 0}},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> rows;
    count_rows(c.fills.data(), c.blocks, c.e_loc, rows);
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    const int64_t max_rows = c.blocks * c.slots;
    const int64_t bound = c.e_loc * max_rows;  // what the CPU pool is reserved for
    for (const auto& dims : {std::vector<int64_t>{64, 128}, std::vector<int64_t>{3, 100}}) {
      const int64_t M = dims[0], hl = dims[1];
      SCOPED_TRACE(testing::Message() << "blocks=" << c.blocks << " E_loc=" << c.e_loc
                                      << " slots=" << c.slots << " M=" << M << " Hl=" << hl);
      ExpertWorkspace ws;
      ws.reserve(c.e_loc, max_rows, M, hl, Precision::kFp32, bound);
      for (int64_t e = 0; e < c.e_loc; ++e) ws.place(e, rows[static_cast<size_t>(e)]);
      for (int64_t cols : {M, hl}) {
        std::vector<int64_t> at(static_cast<size_t>(c.e_loc));
        const int64_t end = expert_row_offsets(rows.data(), c.e_loc, cols, true, 0, at.data());
        EXPECT_LE(end, expert_pool_elements(total, c.e_loc, cols));
        EXPECT_LE(end, expert_pool_elements(bound, c.e_loc, cols));
        for (int64_t e = 0; e < c.e_loc; ++e) {
          const auto i = static_cast<size_t>(e);
          // The CPU's element offset of expert e's rows in its pool of this width.
          const int64_t cpu = cols == M ? ws.in_rows(e) - ws.in[0].data()
                                        : ws.pre_rows(e) - ws.pre[0].data();
          EXPECT_EQ(cpu, ws.first[i] * cols);
          if (cols % kExpertBlockAlign == 0) {
            EXPECT_EQ(at[i], cpu) << "e=" << e;
          } else {
            EXPECT_GE(at[i], cpu) << "e=" << e;
            EXPECT_LE(at[i], cpu + e * (kExpertBlockAlign - 1)) << "e=" << e;
          }
          EXPECT_EQ(at[i] % kExpertBlockAlign, 0) << "e=" << e;
          const int64_t next = e + 1 < c.e_loc ? at[i + 1] : end;
          EXPECT_LE(at[i] + rows[i] * cols, next) << "e=" << e << " overlaps the next expert";
        }
        // A block per expert: at e * stride whatever the fills.
        const int64_t stride = expert_block_stride(max_rows, cols);
        EXPECT_EQ(expert_row_offsets(rows.data(), c.e_loc, cols, false, stride, at.data()),
                  c.e_loc * stride);
        for (int64_t e = 0; e < c.e_loc; ++e) EXPECT_EQ(at[static_cast<size_t>(e)], e * stride);
      }
    }
  }
}

TEST(CudaExpertRows, FillCountsOutOfRangeAreRefused) {
  const std::vector<int32_t> ok = {0, 3, 2, 1};
  EXPECT_NO_THROW(check_fills(ok.data(), 2, 2, 3));
  const std::vector<int32_t> too_many = {0, 4, 2, 1};
  EXPECT_THROW(check_fills(too_many.data(), 2, 2, 3), parm::Error);
  const std::vector<int32_t> negative = {0, 1, -1, 1};
  EXPECT_THROW(check_fills(negative.data(), 2, 2, 3), parm::Error);
}

}  // namespace
}  // namespace parm::moe::cuda
