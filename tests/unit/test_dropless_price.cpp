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
    for (auto& f : links) f = CommFit{0.0, 1e-6, 1.0, 0, 2, "test"};
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

}  // namespace
}  // namespace parm::perfmodel
