// The pipeline and order keys of a training config: parallel.pp, parallel.order,
// parallel.pp_split (a string "3,3" or an array [3, 3]).
#include <gtest/gtest.h>

#include "parm/error.h"
#include "train/train_config.h"

namespace parm::train {
namespace {

TrainConfig parsed(const char* json) {
  TrainConfig c = parse_train_config(nlohmann::json::parse(json), "test.json");
  validate(c);
  return c;
}

std::string refusal(const char* json) {
  try {
    parsed(json);
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << json;
  return "";
}

TEST(TrainConfigPp, ReadsPpOrderAndSplit) {
  const TrainConfig d = parsed("{}");
  EXPECT_EQ(d.parallel.pp, 1);
  EXPECT_EQ(d.parallel.order, "mp-esp-ep-dp-pp");
  EXPECT_EQ(d.parallel.pp_split, "");
  const TrainConfig c = parsed(
      R"({"model": {"num_layers": 6}, "parallel": {"pp": 3, "order": "mp-dp-ep", "pp_split": [1, 2, 3]}})");
  EXPECT_EQ(c.parallel.pp, 3);
  EXPECT_EQ(c.parallel.order, "mp-dp-ep");
  EXPECT_EQ(c.parallel.pp_split, "1,2,3");
  EXPECT_EQ(parsed(R"({"model": {"num_layers": 6}, "parallel": {"pp": 2, "pp_split": "4,2"}})")
                .parallel.pp_split,
            "4,2");
}

TEST(TrainConfigPp, RefusesBadSplitsNamingTheKey) {
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  std::string e = refusal(R"({"model": {"num_layers": 4}, "parallel": {"pp": 2, "pp_split": "3,3"}})");
  EXPECT_TRUE(has(e, "parallel.pp_split) '3,3' sums to 6 blocks, not the model's 4")) << e;
  EXPECT_TRUE(has(e, "e.g. 2,2")) << e;
  e = refusal(R"({"parallel": {"pp": 2, "pp_split": [2, -2]}})");
  EXPECT_TRUE(has(e, "parallel.pp_split [2,-2] must hold whole block counts")) << e;
  e = refusal(R"({"parallel": {"pp_split": 4}})");
  EXPECT_TRUE(has(e, "must be a string \"3,3\" or an array [3, 3]")) << e;
  e = refusal(R"({"model": {"num_layers": 4}, "parallel": {"pp": 5}})");
  EXPECT_TRUE(has(e, "--pp 5 exceeds the model's 4 blocks")) << e;
  e = refusal(R"({"parallel": {"pp": 0}})");
  EXPECT_TRUE(has(e, "parallel.pp 0 must be at least 1")) << e;
  e = refusal(R"({"parallel": {"order": 3}})");
  EXPECT_TRUE(has(e, "parallel.order has the wrong type")) << e;
}

}  // namespace
}  // namespace parm::train
