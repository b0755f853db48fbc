// The model's layout-independent pieces without MPI: config validation against a layout,
// the whole <-> shard mapping of parameters, and shard initialisation.
#include <gtest/gtest.h>

#include <string>

#include "model/init.h"
#include "model/model.h"
#include "model/param.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::model {
namespace {

ModelConfig good_config() {
  ModelConfig c;
  c.vocab = 256;
  c.seq_len = 8;
  c.model_dim = 32;
  c.num_heads = 4;
  c.num_layers = 2;
  c.ffn_hidden = 64;
  c.moe_every = 2;
  c.experts = 4;
  c.expert_hidden = 32;
  c.topk = 2;
  c.capacity_factor = "1.25";
  return c;
}

// Expects InvalidConfig whose message contains `needle`.
template <typename Fn>
void expect_refused(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "accepted, expected a refusal mentioning '" << needle << "'";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

TEST(ModelConfig, GoodConfigsPass) {
  const ModelConfig c = good_config();
  EXPECT_NO_THROW(validate_model(c, make_layout(1, 1, 1, 1), {}, 2));
  EXPECT_NO_THROW(validate_model(c, make_layout(4, 2, 2, 2), {}, 2));
  EXPECT_NO_THROW(validate_model(c, make_layout(4, 4, 1, 4), {}, 2));
  EXPECT_NO_THROW(validate_model(c, make_layout(8, 2, 4, 2), {{schedule::Kind::kS2, true, 2}}, 1));
  EXPECT_EQ(num_moe_blocks(c), 1);
  ModelConfig dense = c;
  dense.moe_every = 0;
  EXPECT_EQ(num_moe_blocks(dense), 0);
  dense.experts = 3;  // irrelevant without MoE blocks
  EXPECT_NO_THROW(validate_model(dense, make_layout(4, 1, 4, 1), {}, 1));
}

TEST(ModelConfig, BadConfigsAreRefusedWithMessages) {
  const ModelConfig good = good_config();
  auto with = [&](auto edit) {
    ModelConfig c = good;
    edit(c);
    return c;
  };
  const Layout one = make_layout(1, 1, 1, 1);
  expect_refused([&] { validate_model(with([](auto& c) { c.num_heads = 3; }), one, {}, 2); },
                 "not divisible by num_heads");
  expect_refused([&] { validate_model(with([](auto& c) { c.topk = 5; }), one, {}, 2); }, "topk");
  expect_refused(
      [&] { validate_model(with([](auto& c) { c.capacity_factor = "1."; }), one, {}, 2); }, "1.");
  expect_refused([&] { validate_model(good, one, {}, 0); }, "micro_batch");
  expect_refused([&] { validate_model(with([](auto& c) { c.seq_len = 0; }), one, {}, 2); },
                 "seq_len");
  // Layout constraints.
  expect_refused([&] { validate_model(with([](auto& c) { c.num_heads = 2; c.model_dim = 32; }),
                                      make_layout(4, 4, 1, 1), {}, 2); },
                 "num_heads 2 is not divisible by --mp 4");
  expect_refused([&] { validate_model(with([](auto& c) { c.ffn_hidden = 66; }),
                                      make_layout(4, 4, 1, 1), {}, 2); },
                 "ffn_hidden 66 is not divisible by --mp 4");
  expect_refused([&] { validate_model(with([](auto& c) { c.experts = 6; }),
                                      make_layout(4, 1, 4, 1), {}, 2); },
                 "experts 6 is not divisible by --ep 4");
  expect_refused([&] { validate_model(with([](auto& c) { c.expert_hidden = 30; }),
                                      make_layout(4, 1, 1, 4), {}, 2); },
                 "expert_hidden 30 is not divisible by --esp 4");
  expect_refused([&] { validate_model(with([](auto& c) { c.seq_len = 3; }),
                                      make_layout(2, 2, 1, 2), {}, 1); },
                 "not divisible by --mp 2");
  expect_refused([&] { validate_model(good, make_layout(4, 2, 1, 4),
                                      {{schedule::Kind::kBaseline, false, 1}}, 2); },
                 "use --schedule s1 or s2");
  expect_refused([&] { validate_model(good, one, {{}, {}, {}}, 2); }, "3 MoE schedules");
  expect_refused([&] { validate_model(good, one, {{schedule::Kind::kS1, true, 0}}, 2); },
                 "chunks");
}

TEST(ModelParam, ShardBoxAndCopiesRoundTrip) {
  // An expert W1 (E=4, M=3, H=6): dim 0 over ep = 2, then dim 2 over esp = 3.
  const Shape whole_shape = {4, 3, 6};
  Tensor whole(whole_shape);
  for (int64_t i = 0; i < whole.numel(); ++i) whole[i] = static_cast<float>(i);
  Tensor rebuilt(whole_shape);
  rebuilt.fill(-1.0f);
  for (int ep = 0; ep < 2; ++ep)
    for (int esp = 0; esp < 3; ++esp) {
      const std::vector<Split> splits = {{0, 2, ep}, {2, 3, esp}};
      const ShardBox box = shard_box(whole_shape, splits);
      EXPECT_EQ(box.extent, (Shape{2, 3, 2}));
      EXPECT_EQ(box.offset, (Shape{2 * ep, 0, 2 * esp}));
      Tensor local(box.extent);
      copy_shard_from_whole(whole, splits, local);
      for (int64_t e = 0; e < 2; ++e)
        for (int64_t m = 0; m < 3; ++m)
          for (int64_t h = 0; h < 2; ++h)
            EXPECT_EQ(local[(e * 3 + m) * 2 + h],
                      whole[((2 * ep + e) * 3 + m) * 6 + 2 * esp + h]);
      copy_shard_to_whole(local, splits, rebuilt);
    }
  for (int64_t i = 0; i < whole.numel(); ++i) ASSERT_EQ(rebuilt[i], whole[i]) << i;
  // Two splits of the same dim compose: 12 rows over 2, then over 3 -> rows [2*6 + ... ).
  const ShardBox b = shard_box({12, 5}, {{0, 2, 1}, {0, 3, 2}});
  EXPECT_EQ(b.offset, (Shape{10, 0}));
  EXPECT_EQ(b.extent, (Shape{2, 5}));
  EXPECT_THROW(shard_box({5, 4}, {{0, 2, 0}}), Error);
}

TEST(ModelParam, ShardInitEqualsSlicedWholeInit) {
  Param p;
  p.name = "blocks.1.moe.experts.w1";
  p.whole_shape = {4, 8, 6};
  Tensor whole(p.whole_shape);
  fill_normal(whole, 7, param_stream(p.name), 0.0f, 0.5f);
  for (int ep = 0; ep < 2; ++ep)
    for (int esp = 0; esp < 2; ++esp) {
      p.splits = {{0, 2, ep}, {2, 2, esp}};
      p.value = Tensor(local_shape(p.whole_shape, p.splits));
      init_param_normal(p, 7, 0.0f, 0.5f);
      Tensor expected(p.value.shape());
      copy_shard_from_whole(whole, p.splits, expected);
      for (int64_t i = 0; i < expected.numel(); ++i) ASSERT_EQ(p.value[i], expected[i]) << i;
    }
  EXPECT_NE(param_stream("a"), param_stream("b"));
}

}  // namespace
}  // namespace parm::model
