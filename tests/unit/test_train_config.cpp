// Training configs: the shipped ones load and validate; bad ones are refused with messages
// that name the key; the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "moe/backend.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/topology.h"
#include "train/data_setup.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace parm::train {
namespace {

void expect_refused(const char* json, const std::string& needle) {
  try {
    validate(parse_train_config(nlohmann::json::parse(json), "test.json"));
    FAIL() << "accepted: " << json;
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainConfig, ShippedConfigsLoadAndValidate) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(PARM_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".json") continue;
    const TrainConfig c = load_train_config(entry.path().string());
    EXPECT_NO_THROW(validate(c)) << entry.path();
    EXPECT_EQ(c.name, entry.path().stem().string());
    ++n;
  }
  // gpt2-moe-tiny(-pp, -bpe), bert-moe-tiny, gpt2-small-moe, bert-base-moe, mixtral-moe-tiny,
  // deepseek-moe-tiny
  EXPECT_EQ(n, 8);
}

// data.tokenizer: a name or file, or a kind and size (then model.vocab comes from the size,
// without a file being read); bad forms are refused naming the key.
TEST(TrainConfig, DataTokenizerKindAndSize) {
  TrainConfig c = load_train_config(PARM_SOURCE_DIR "/configs/gpt2-moe-tiny-bpe.json");
  EXPECT_EQ(c.data.tokenizer, "bpe");
  EXPECT_EQ(c.data.tokenizer_vocab, 8192);
  apply_tokenizer_vocab(c);
  EXPECT_EQ(c.model.vocab, 8192);
  validate(c);
  nlohmann::json j =
      nlohmann::json::parse(read_file(PARM_SOURCE_DIR "/configs/bert-moe-tiny.json"));
  j["data"]["tokenizer"] = {{"kind", "unigram"}, {"vocab", 1000}};
  c = parse_train_config(j, "bert");
  apply_tokenizer_vocab(c);
  EXPECT_EQ(c.model.vocab, 1001);  // + [MASK]
  for (const nlohmann::json& bad :
       {nlohmann::json{{"kind", "wordpiece"}, {"vocab", 8192}}, nlohmann::json{{"kind", "bpe"}},
        nlohmann::json{{"kind", "bpe"}, {"vocab", 100}},
        nlohmann::json{{"kind", "bpe"}, {"vocab", 8192}, {"file", "x"}}, nlohmann::json(5)}) {
    j["data"]["tokenizer"] = bad;
    try {
      parse_train_config(j, "cfg.json");
      ADD_FAILURE() << bad.dump() << " was accepted";
    } catch (const InvalidConfig& e) {
      EXPECT_NE(std::string(e.what()).find("data.tokenizer"), std::string::npos) << e.what();
    }
  }
  j["data"]["tokenizer"] = {{"kind", "bpe"}, {"vocab", 8192}};
  j["model"]["vocab"] = 300;
  c = parse_train_config(j, "cfg.json");
  try {
    apply_tokenizer_vocab(c);
    ADD_FAILURE() << "model.vocab 300 beside an 8192 tokenizer was accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab 300 is not the tokenizer's"),
              std::string::npos)
        << e.what();
  }
  j["data"]["tokenizer"] = "bpe";  // a kind needs its size
  c = parse_train_config(j, "cfg.json");
  EXPECT_THROW(apply_tokenizer_vocab(c), InvalidConfig);
}

// Dropless routing: "capacity_factor": null in both tiny model configs (and "none" as text);
// it is written back as null; a number is refused naming the valid forms.
TEST(TrainConfig, DroplessIsNullInEitherModelConfig) {
  for (const char* name : {"gpt2-moe-tiny", "bert-moe-tiny"}) {
    nlohmann::json j = nlohmann::json::parse(
        read_file(std::string(PARM_SOURCE_DIR "/configs/") + name + ".json"));
    j["model"]["capacity_factor"] = nullptr;
    const TrainConfig c = parse_train_config(j, name);
    EXPECT_NO_THROW(validate(c)) << name;
    EXPECT_EQ(c.model.capacity_factor, "none") << name;
    const nlohmann::json written = model_config_json(c.model);
    EXPECT_TRUE(written["capacity_factor"].is_null()) << name;
    EXPECT_EQ(parse_train_config({{"model", written}}, name).model.capacity_factor, "none")
        << name;
  }
  expect_refused(R"({"model": {"capacity_factor": 1.25}})", "or null for dropless routing");
}

TEST(TrainConfig, DefaultsAndSections) {
  const TrainConfig c = parse_train_config(nlohmann::json::parse(R"({"model": {"arch": "bert"}})"),
                                           "t");
  EXPECT_EQ(c.model.arch, model::Arch::kBert);
  EXPECT_EQ(c.model.vocab, 257);  // bytes + [MASK]
  EXPECT_EQ(c.parallel.schedule, "s1");
  EXPECT_EQ(c.optim.sharding, "none");
  EXPECT_EQ(parse_train_config(nlohmann::json::parse(R"({"optim": {"sharding": "dp"}})"), "t")
                .optim.sharding,
            "dp");
}

TEST(TrainConfig, RefusesBadInputNamingTheKey) {
  expect_refused(R"({"model": {"layers": 3}})", "unknown key test.json: model.layers");
  expect_refused(R"({"optimizer": {}})", "unknown key test.json.optimizer");
  expect_refused(R"({"train": {"steps": "ten"}})", "train.steps has the wrong type");
  expect_refused(R"({"model": {"arch": "t5"}})", "model.arch 't5' is not valid");
  expect_refused(R"({"train": {"micro_batch": 0}})", "train.micro_batch is 0");
  expect_refused(R"({"model": {"model_dim": 100, "num_heads": 3}})", "not divisible by model.num_heads");
  expect_refused(R"({"parallel": {"schedule": "fast"}})", "parallel.schedule 'fast' is not valid");
  expect_refused(R"({"model": {"capacity_factor": "1e3"}})", "1e3");
  expect_refused(R"({"optim": {"lr": 0.001, "min_lr": 0.01}})", "optim.min_lr");
  expect_refused(R"({"optim": {"sharding": "zero1"}})",
                 "optim.sharding (--optimizer-sharding) 'zero1' is not valid; use none");
  expect_refused(R"({"optim": {"sharding": 1}})", "optim.sharding has the wrong type");
}

// The router options on a device whose gate has none are refused by validate(), before any
// work, naming the option; the check comes before the device's own (so it holds in a build
// without CUDA, where --device cuda alone is refused for the build).
TEST(TrainConfig, RefusesRouterOptionsOnCudaBeforeTheDeviceCheck) {
  expect_refused(R"({"model": {"router_z_loss": 0.01}, "parallel": {"device": "cuda"}})",
                 "--router-z-loss (model.router_z_loss) 0.01 with --device cuda");
  expect_refused(R"({"model": {"router_bias_update": 0.001}, "parallel": {"device": "cuda"}})",
                 "--router-bias-update (model.router_bias_update) 0.001 with --device cuda");
  EXPECT_NO_THROW(moe::check_router_options(Device::kCpu, 0.01f, 0.001f));
  EXPECT_NO_THROW(moe::check_router_options(Device::kCuda, 0.0f, 0.0f));
  EXPECT_THROW(moe::check_router_options(Device::kCuda, 0.0f, 0.5f), InvalidConfig);
}

// parallel.shared_overlap (--shared-overlap): a bool, false by default; it needs shared
// experts (the message names both flags, as the layer commands'); how the layers run, so not
// in the model section a checkpoint compares.
TEST(TrainConfig, SharedOverlapIsAParallelBoolOutsideTheModelSection) {
  const char* on = R"({"model": {"shared_experts": 1, "shared_hidden": 64},
                       "parallel": {"shared_overlap": true}})";
  const TrainConfig c = parse_train_config(nlohmann::json::parse(on), "t");
  EXPECT_TRUE(c.parallel.shared_overlap);
  EXPECT_NO_THROW(validate(c));
  EXPECT_FALSE(parse_train_config(nlohmann::json::object(), "t").parallel.shared_overlap);
  TrainConfig off = c;
  off.parallel.shared_overlap = false;
  EXPECT_EQ(model_config_json(c.model), model_config_json(off.model));
  EXPECT_FALSE(model_config_json(c.model).contains("shared_overlap"));
  expect_refused(R"({"parallel": {"shared_overlap": "on"}})",
                 "parallel.shared_overlap has the wrong type or is out of range: \"on\" "
                 "(expected true or false)");
  expect_refused(R"({"parallel": {"shared_overlap": 1}})", "parallel.shared_overlap has the "
                                                          "wrong type");
  expect_refused(R"({"parallel": {"shared_overlap": true}})",
                 "--shared-overlap on (parallel.shared_overlap) needs shared experts: set "
                 "--shared-experts N >= 1 (model.shared_experts), or --shared-overlap off");
  EXPECT_NO_THROW(validate(parse_train_config(
      nlohmann::json::parse(R"({"parallel": {"shared_overlap": false}})"), "t")));
}

// parallel.pad_to_capacity (--pad-to-capacity): a bool, true by default; false reaches the
// layers' shapes through their schedules (model::layer_shape), so their exchanges move the
// kept rows only; how the layers run, so not in the model section a checkpoint compares.
TEST(TrainConfig, PadToCapacityIsAParallelBoolOutsideTheModelSection) {
  const TrainConfig def = parse_train_config(nlohmann::json::object(), "t");
  EXPECT_TRUE(def.parallel.pad_to_capacity);
  const TrainConfig c = parse_train_config(
      nlohmann::json::parse(R"({"parallel": {"pad_to_capacity": false}})"), "t");
  EXPECT_FALSE(c.parallel.pad_to_capacity);
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(model_config_json(c.model), model_config_json(def.model));
  EXPECT_FALSE(model_config_json(c.model).contains("pad_to_capacity"));
  model::LayerSchedule s;
  EXPECT_TRUE(model::layer_shape(c.model, 2, s).pad_to_capacity);
  s.pad_to_capacity = false;
  const MoeShape unpadded = model::layer_shape(c.model, 2, s);
  EXPECT_FALSE(unpadded.pad_to_capacity);
  EXPECT_TRUE(unpadded.packed_rows());  // the default model has a capacity factor (1.25)
  EXPECT_FALSE(model::layer_shape(c.model, 2, model::LayerSchedule{}).packed_rows());
  EXPECT_NE(unpadded.str().find(" unpadded"), std::string::npos) << unpadded.str();
  expect_refused(R"({"parallel": {"pad_to_capacity": "off"}})",
                 "parallel.pad_to_capacity has the wrong type or is out of range: \"off\" "
                 "(expected true or false)");
}

// model.shared_hidden left out (or 0) with shared experts is the experts' width, as the layer
// commands' --shared-hidden and parm.torch.MoE's shared_hidden default; the model section a
// checkpoint compares holds the width itself, so either spelling resumes the other.
TEST(TrainConfig, SharedHiddenDefaultsToTheExpertsWidth) {
  const TrainConfig c = parse_train_config(
      nlohmann::json::parse(R"({"model": {"shared_experts": 2, "expert_hidden": 96}})"), "t");
  EXPECT_EQ(c.model.shared_hidden, 0);
  EXPECT_EQ(model::shared_width(c.model), 96);
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(model::moe_shape(c.model, 2).shared_hidden, 96);
  TrainConfig explicit_width = c;
  explicit_width.model.shared_hidden = 96;
  EXPECT_EQ(model_config_json(c.model), model_config_json(explicit_width.model));
  EXPECT_EQ(model_config_json(c.model)["shared_hidden"], 96);
  explicit_width.model.shared_hidden = 48;
  EXPECT_EQ(model::moe_shape(explicit_width.model, 2).shared_hidden, 48);
  // Without shared experts there is no width.
  const TrainConfig none = parse_train_config(nlohmann::json::object(), "t");
  EXPECT_EQ(model::shared_width(none.model), 0);
  EXPECT_EQ(model::moe_shape(none.model, 2).shared_hidden, 0);
  TrainConfig negative = c;
  negative.model.shared_hidden = -4;
  try {
    model::validate_model(negative.model, make_layout(2, 1, 2, 1), {}, 2);
    ADD_FAILURE() << "shared_hidden -4 accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("--shared-hidden (model.shared_hidden) -4 must be >= 1"),
              std::string::npos)
        << e.what();
  }
}

// Values that nlohmann's get<T> would convert silently: fractions to integers, integers
// wrapped into a narrower type, and out-of-range doubles into floats.
TEST(TrainConfig, RefusesNumbersThatDoNotFitTheirField) {
  expect_refused(R"({"train": {"steps": 2.5}})", "train.steps has the wrong type or is out of range");
  expect_refused(R"({"parallel": {"mp": 4294967297}})", "parallel.mp has the wrong type");
  expect_refused(R"({"model": {"seed": -1}})", "model.seed has the wrong type");
  expect_refused(R"({"model": {"aux_loss_coeff": 1e300}})", "model.aux_loss_coeff has the wrong type");
  expect_refused(R"({"train": {"steps": true}})", "train.steps has the wrong type");
}

TEST(LearningRate, WarmupThenCosineToMinimum) {
  OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 4;
  c.total_steps = 14;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1.0);                  // start of the decay
  EXPECT_NEAR(lr_at(c, 9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(c, 14), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(c, 20), 0.1);                 // past the end: stays at min_lr
}

}  // namespace
}  // namespace parm::train
