// The row bookkeeping of the device experts (moe/cuda/expert_rows.h) on the CPU: the
// segment copies that gather each expert's filled rows out of the exchange layout and
// scatter them back, run here by a host emulation of the copy kernel, must give exactly the
// rows the layout contract names (moe_ops.h), write nothing else on a gather and every
// element on a scatter (zeros at empty slots).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/expert_math.h"
#include "moe/cuda/expert_rows.h"
#include "parm/error.h"

namespace parm::moe::cuda {
namespace {

constexpr float kSentinel = -12345.0f;

// What parm::cuda::copy_segments does, on host memory.
void apply(const parm::cuda::SegmentCopy& s) {
  for (int64_t i = 0; i < s.copy; ++i) {
    s.dst[i] = s.src[i];
    if (s.dst_bf16 != nullptr) s.dst_bf16[i] = parm::cuda::expert_math::f32_to_bf16(s.src[i]);
  }
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

void check_gather_and_scatter(const Layout& l) {
  const int64_t max_rows = l.blocks * l.slots;
  const int64_t stride = max_rows * l.M + 3;  // not the tight stride: offsets must use it
  std::vector<float> layout(static_cast<size_t>(l.blocks * l.e_loc * l.slots * l.M));
  for (int64_t b = 0; b < l.blocks; ++b)
    for (int64_t e = 0; e < l.e_loc; ++e)
      for (int64_t s = 0; s < l.slots; ++s)
        for (int64_t c = 0; c < l.M; ++c)
          layout[static_cast<size_t>(segment_offset(b, e, l.e_loc, l.slots, l.M) + s * l.M + c)] =
              layout_value(b, e, s, c);

  std::vector<int64_t> rows;
  count_rows(l.fills.data(), l.blocks, l.e_loc, rows);
  ASSERT_EQ(static_cast<int64_t>(rows.size()), l.e_loc);

  // Gather: expert e's packed row n is the n-th filled row in block order; nothing else
  // of the packed buffers is written.
  std::vector<float> packed(static_cast<size_t>(l.e_loc * stride), kSentinel);
  std::vector<uint16_t> packed_bf16(packed.size(), 0xdead);
  int emitted = 0;
  plan_gather(layout.data(), l.blocks, l.e_loc, l.slots, l.M, l.fills.data(), packed.data(),
              packed_bf16.data(), stride, [&](const parm::cuda::SegmentCopy& s) {
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
          const size_t i = static_cast<size_t>(e * stride + n * l.M + c);
          ASSERT_EQ(packed[i], layout_value(b, e, s, c)) << "e=" << e << " b=" << b << " s=" << s;
          ASSERT_EQ(packed_bf16[i], parm::cuda::expert_math::f32_to_bf16(layout_value(b, e, s, c)));
        }
    for (int64_t i = n * l.M; i < stride; ++i) {
      ASSERT_EQ(packed[static_cast<size_t>(e * stride + i)], kSentinel) << "e=" << e << " i=" << i;
      ASSERT_EQ(packed_bf16[static_cast<size_t>(e * stride + i)], 0xdead);
    }
  }

  // Scatter back into a layout full of sentinels: filled rows come back where they were,
  // every empty slot is zero, and no element keeps its sentinel.
  std::vector<float> back(layout.size(), kSentinel);
  plan_scatter(packed.data(), stride, l.blocks, l.e_loc, l.slots, l.M, l.fills.data(), back.data(),
               [&](const parm::cuda::SegmentCopy& s) {
                 EXPECT_EQ(s.dst_bf16, nullptr);
                 EXPECT_EQ(s.copy + s.zero, l.slots * l.M);
                 apply(s);
               });
  for (int64_t b = 0; b < l.blocks; ++b)
    for (int64_t e = 0; e < l.e_loc; ++e)
      for (int64_t s = 0; s < l.slots; ++s)
        for (int64_t c = 0; c < l.M; ++c) {
          const float want =
              s < l.fills[static_cast<size_t>(b * l.e_loc + e)] ? layout_value(b, e, s, c) : 0.0f;
          ASSERT_EQ(
              back[static_cast<size_t>(segment_offset(b, e, l.e_loc, l.slots, l.M) + s * l.M + c)],
              want)
              << "b=" << b << " e=" << e << " s=" << s << " c=" << c;
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
  for (const Layout& l : layouts) {
    SCOPED_TRACE(testing::Message() << "blocks=" << l.blocks << " E_loc=" << l.e_loc
                                    << " slots=" << l.slots << " M=" << l.M);
    check_gather_and_scatter(l);
  }
}

TEST(CudaExpertRows, ScatterOfZeroSlotsEmitsNothing) {
  const std::vector<int32_t> fills = {0, 0};
  int emitted = 0;
  plan_scatter(nullptr, 0, 1, 2, 0, 8, fills.data(), nullptr,
               [&](const parm::cuda::SegmentCopy&) { ++emitted; });
  EXPECT_EQ(emitted, 0);
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
