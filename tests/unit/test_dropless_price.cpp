// The cost model prices a dropless schedule's exchanges from the routed rows (k T_gate, times
// the busiest rank's share), not from its worst-case buffers (C = T rows per expert).
#include <gtest/gtest.h>

#include "perfmodel/dropless_price.h"
#include "perfmodel/model.h"

namespace parm::perfmodel {
namespace {

using schedule::Kind;

// Only collectives cost: alpha 0, one microsecond per byte on every link.
Profile bytes_profile() {
  Profile p;
  for (auto& links : p.comm)
    for (auto& f : links) {
      f = CommFit{};
      f.beta_us_per_byte = 1e-6;
    }
  for (auto& g : p.gemm) g = GemmFit{0.0, 1e15, 1.0, 0, "test"};
  for (auto& m : p.mem) m = MemFit{0.0, 1e15, 1.0, 0, "test"};
  return p;
}

double bytes_of(const Prediction& p, const std::string& label) {
  for (const auto& s : p.steps)
    if (s.label == label) {
      double b = 0;
      for (const auto& part : s.fwd_parts) b += part.bus_bytes;
      return b;
    }
  ADD_FAILURE() << "no step " << label;
  return 0;
}

TEST(DroplessPrice, ExchangesCarryTheRoutedRowsTimesTheImbalance) {
  Target t = make_target(0, 2, 2, 2, 0);
  const auto none = MoeShape::of(2048, 64, 128, 8, 2, "none");
  // f = 2.0 with k = 2 has C1 = k f (T/2) / E = 512 slots; dropless routes k T/2 = 2048 rows
  // of 8 x 1024 slots: the same as a factor of 1.0, i.e. half of f = 2.0's bytes.
  const auto two = MoeShape::of(2048, 64, 128, 8, 2, "2.0");
  for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2}) {
    const auto sd = schedule::build({none, t.layout, 0, false, 1}, kind);
    const auto sf = schedule::build({two, t.layout, 0, false, 1}, kind);
    const Prediction d = predict(bytes_profile(), sd, none, t);
    const Prediction f = predict(bytes_profile(), sf, two, t);
    EXPECT_DOUBLE_EQ(bytes_of(d, "dispatch alltoall"), 0.5 * bytes_of(f, "dispatch alltoall"))
        << schedule::kind_name(kind);
    t.load_max_over_mean = 1.5;  // the busiest rank routes 1.5x the mean
    const Prediction skewed = predict(bytes_profile(), sd, none, t);
    t.load_max_over_mean = 1.0;
    EXPECT_DOUBLE_EQ(bytes_of(skewed, "dispatch alltoall"), 1.5 * bytes_of(d, "dispatch alltoall"))
        << schedule::kind_name(kind);
    // Not dropless: the listed bytes, whatever the load.
    for (const auto& s : sf.steps)
      EXPECT_EQ(dropless_share(sf, s, two, 3.0), 1.0) << s.label;
  }
}

// --pad-to-capacity off: the exchanges of a capacity-factor layer carry the kept rows, priced as
// dropless's: k T_gate / E of an expert's C slots times the imbalance, never above the buffer.
// At f 2.0 the padded buffers are twice the routed rows; unpadded pays half of them, and at
// an imbalance past f (3.0) the whole buffer, as padded, since no expert keeps more than C.
TEST(DroplessPrice, UnpaddedCapacityPaysTheKeptRows) {
  Target t = make_target(0, 2, 2, 2, 0);
  const auto padded = MoeShape::of(2048, 64, 128, 8, 2, "2.0");
  auto unpadded = padded;
  unpadded.pad_to_capacity = false;
  for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2}) {
    const auto sp = schedule::build({padded, t.layout, 0, false, 1}, kind);
    const auto su = schedule::build({unpadded, t.layout, 0, false, 1}, kind);
    EXPECT_FALSE(sp.packed) << schedule::kind_name(kind);
    EXPECT_TRUE(su.packed && !su.dropless) << schedule::kind_name(kind);
    EXPECT_EQ(su.capacity, sp.capacity) << schedule::kind_name(kind);
    const Prediction p = predict(bytes_profile(), sp, padded, t);
    const Prediction u = predict(bytes_profile(), su, unpadded, t);
    EXPECT_DOUBLE_EQ(bytes_of(u, "dispatch alltoall"), 0.5 * bytes_of(p, "dispatch alltoall"))
        << schedule::kind_name(kind);
    t.load_max_over_mean = 3.0;
    const Prediction full = predict(bytes_profile(), su, unpadded, t);
    t.load_max_over_mean = 1.0;
    EXPECT_DOUBLE_EQ(bytes_of(full, "dispatch alltoall"), bytes_of(p, "dispatch alltoall"))
        << schedule::kind_name(kind);
  }
}

// A packed capacity-factor buffer holds at most its padded layout's rows (each segment keeps at
// most its slots): the bound is E x slots, not dropless's k x slots, which would be short
// where slots = C < T (here k C = 8 x 128 rows against the 64 x 128 of a block).
TEST(DroplessPrice, UnpaddedBuffersHoldTheirPaddedRows) {
  auto s = MoeShape::of(1024, 64, 128, 64, 8, "1.0");  // C = 128 per expert
  s.pad_to_capacity = false;
  const Layout l = make_target(0, 1, 2, 1, 0).layout;
  for (Kind kind : {Kind::kS1, Kind::kS2}) {
    const auto sc = schedule::build({s, l, 0, false, 1}, kind);
    for (const auto& b : sc.buffers) {
      if (b.slots == 0) continue;
      EXPECT_EQ(b.max_routed_rows, shape_numel(b.shape) / s.model_dim)
          << schedule::kind_name(kind) << " " << b.name;
    }
    EXPECT_EQ(schedule::dropless_local_rows(sc, s.topk, s.experts / 2),
              sc.expert_blocks * sc.exchange_slots * (s.experts / 2));
  }
}

}  // namespace
}  // namespace parm::perfmodel
