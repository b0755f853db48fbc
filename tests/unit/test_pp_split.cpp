// --pp-split: the blocks of each pipeline stage.
#include <gtest/gtest.h>

#include "model/pp_split.h"
#include "parm/error.h"

namespace parm::model {
namespace {

std::string refusal(const std::string& text, int pp, int64_t blocks) {
  try {
    parse_pp_split(text, pp, blocks);
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  ADD_FAILURE() << "'" << text << "' accepted";
  return "";
}

TEST(PpSplit, BalancedGivesTheRemainderToTheFirstStages) {
  EXPECT_EQ(balanced_pp_split(4, 12), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(balanced_pp_split(4, 10), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(balanced_pp_split(1, 4), (std::vector<int64_t>{4}));
  EXPECT_EQ(parse_pp_split("", 2, 5), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(pp_split_text({3, 3, 2, 2}), "3,3,2,2");
}

TEST(PpSplit, ParsesAValidSplit) {
  EXPECT_EQ(parse_pp_split("1,5,6", 3, 12), (std::vector<int64_t>{1, 5, 6}));
  EXPECT_EQ(parse_pp_split("12", 1, 12), (std::vector<int64_t>{12}));
}

TEST(PpSplit, RefusesWithTheValidForm) {
  const std::string form = "3 positive block counts (one per stage, first to last), "
                           "comma-separated, summing to the model's 12 blocks, e.g. 4,4,4";
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  std::string e = refusal("4,4", 3, 12);
  EXPECT_TRUE(has(e, "names 2 stages but --pp is 3")) << e;
  EXPECT_TRUE(has(e, form)) << e;
  e = refusal("4,4,5", 3, 12);
  EXPECT_TRUE(has(e, "sums to 13 blocks, not the model's 12")) << e;
  e = refusal("6,6,0", 3, 12);
  EXPECT_TRUE(has(e, "stage 2 holds 0 blocks")) << e;
  e = refusal("4,x,4", 3, 12);
  EXPECT_TRUE(has(e, "'x' is not a block count")) << e;
  e = refusal("4,,8", 3, 12);
  EXPECT_TRUE(has(e, "'' is not a block count")) << e;
  e = refusal("4,-4,12", 3, 12);
  EXPECT_TRUE(has(e, "'-4' is not a block count")) << e;
  e = refusal("1,1,1,1,1", 5, 4);
  EXPECT_TRUE(has(e, "--pp 5 exceeds the model's 4 blocks")) << e;
  EXPECT_TRUE(has(e, "valid --pp values: 1 to 4")) << e;
  EXPECT_TRUE(has(refusal("", 0, 4), "--pp 0 must be at least 1"));
}

}  // namespace
}  // namespace parm::model
