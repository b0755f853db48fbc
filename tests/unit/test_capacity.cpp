// Capacity factor parsing and exact capacity (docs/spec.md §2 item 3).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "shape/shape.h"
#include "parm/error.h"

namespace parm {
namespace {

TEST(Capacity, SpecExampleIsExact) {
  const CapacityFactor f = CapacityFactor::parse("1.1");
  EXPECT_EQ(capacity(1, f, 3000, 4), 825);
  // The same sum in doubles rounds up past 825: the reason capacity is done in integers.
  volatile double f_double = 1.1;
  EXPECT_EQ(std::ceil(f_double * 3000.0 / 4.0), 826.0);
}

TEST(Capacity, CeilAndEdges) {
  EXPECT_EQ(capacity(2, CapacityFactor::parse("1.25"), 10, 4), 7);  // 25/4 = 6.25 -> 7
  EXPECT_EQ(capacity(1, CapacityFactor::parse("1"), 8, 4), 2);      // exact, no rounding up
  EXPECT_EQ(capacity(2, CapacityFactor::parse("0.5"), 3, 4), 1);    // 0.75 -> 1
  EXPECT_EQ(capacity(3, CapacityFactor::parse("0.25"), 4, 4), 1);   // 0.75 -> 1
  EXPECT_EQ(capacity(1, CapacityFactor::parse("1.0"), 0, 4), 0);    // no minimum capacity
  EXPECT_EQ(capacity(1, CapacityFactor::parse("0.01"), 1, 64), 1);  // tiny but nonzero -> 1
  EXPECT_EQ(capacity(4, CapacityFactor::parse("2.0"), 1024, 8), 1024);
}

// Dropless: "none" parses, prints back, and gives C = T (a token's k choices are distinct
// experts, so no expert can receive more than T): nothing drops whatever k and E are.
TEST(Capacity, DroplessIsTokensPerExpert) {
  const CapacityFactor f = CapacityFactor::parse("none");
  EXPECT_TRUE(f.dropless);
  EXPECT_EQ(f.str(), "none");
  EXPECT_TRUE(std::isinf(f.value()));
  EXPECT_FALSE(CapacityFactor::parse("1.2").dropless);
  EXPECT_EQ(capacity(2, f, 40, 8), 40);
  EXPECT_EQ(capacity(1, f, 7, 64), 7);
  EXPECT_EQ(capacity(3, f, 0, 4), 0);
  EXPECT_NO_THROW(MoeShape::of(8, 4, 4, 4, 2, "none").validate());
  EXPECT_EQ(MoeShape::of(8, 4, 4, 4, 2, "none").str(), "T=8 M=4 H=4 E=4 k=2 f=none");
  EXPECT_THROW(CapacityFactor::parse("None"), InvalidConfig);
}

TEST(Capacity, RefusesBadArguments) {
  const CapacityFactor f{1, 1};
  EXPECT_THROW(capacity(0, f, 10, 4), InvalidConfig);
  EXPECT_THROW(capacity(1, f, -1, 4), InvalidConfig);
  EXPECT_THROW(capacity(1, f, 10, 0), InvalidConfig);
  EXPECT_THROW(capacity(1, CapacityFactor{1, 0}, 10, 4), InvalidConfig);
  EXPECT_THROW(capacity(1, CapacityFactor{-1, 1}, 10, 4), InvalidConfig);
  EXPECT_THROW(capacity(8, CapacityFactor::parse("999999999999999999"), int64_t{1} << 40, 4),
               InvalidConfig);
}

TEST(CapacityFactor, ParsesDecimalsExactly) {
  struct Case {
    const char* text;
    int64_t num, den;
    double value;
  };
  for (const Case& c : {Case{"1.2", 12, 10, 1.2}, Case{"1", 1, 1, 1.0},
                        Case{"0.25", 25, 100, 0.25}, Case{"2.0", 20, 10, 2.0},
                        Case{"1.10", 110, 100, 1.1}, Case{"0.05", 5, 100, 0.05},
                        Case{"16", 16, 1, 16.0}, Case{"007.5", 75, 10, 7.5}}) {
    SCOPED_TRACE(c.text);
    const CapacityFactor f = CapacityFactor::parse(c.text);
    EXPECT_EQ(f.num, c.num);
    EXPECT_EQ(f.den, c.den);
    EXPECT_DOUBLE_EQ(f.value(), c.value);
  }
}

TEST(CapacityFactor, StrRoundTrips) {
  for (const char* text : {"1.2", "1", "0.25", "2.0", "1.10", "0.05", "16", "123.456"}) {
    EXPECT_EQ(CapacityFactor::parse(text).str(), text);
  }
  EXPECT_EQ((CapacityFactor{6, 5}).str(), "6/5");  // not a decimal: shown as a fraction
}

TEST(CapacityFactor, RefusesWithMessage) {
  struct Case {
    std::string text;
    const char* why;
  };
  for (const Case& c : {Case{"", "empty"}, Case{"-1", "negative"}, Case{"-0.5", "negative"},
                        Case{"abc", "unexpected character 'a'"},
                        Case{"1e3", "exponent"}, Case{"1.5E-1", "exponent"},
                        Case{"1.", "no digit after"}, Case{".5", "no digit before"},
                        Case{"1.2.3", "unexpected character '.'"},
                        Case{" 1", "unexpected character ' '"},
                        Case{"1 ", "unexpected character ' '"},
                        Case{"+1", "unexpected character '+'"},
                        Case{"1,5", "unexpected character ','"},
                        Case{"inf", "unexpected character"}, Case{"nan", "unexpected character"},
                        Case{"0", "greater than 0"}, Case{"0.000", "greater than 0"},
                        Case{"1234567890.1234567890", "too many digits"}}) {
    SCOPED_TRACE("text '" + c.text + "'");
    try {
      CapacityFactor::parse(c.text);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidConfig& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + c.text + "'"), std::string::npos) << msg;  // names the text
      EXPECT_NE(msg.find(c.why), std::string::npos) << msg;               // says what is wrong
      EXPECT_NE(msg.find("such as 1, 1.25"), std::string::npos) << msg;   // and what is valid
    }
  }
}

}  // namespace
}  // namespace parm
