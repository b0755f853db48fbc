// Checkpoints across ranks: save/load traffic goes over the world group's communicator (so it
// is counted and bounded by its deadline), a round trip is bit-exact (-0.0 included) on a
// sharded layout, and a manifest whose `bytes` disagrees with the shape is refused on every
// rank before any data is read, leaving the model untouched; the optimizer state saved
// sharded over dp and edp loads unsharded and the reverse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "mpi_test_util.h"
#include "parm/fileio.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"

namespace parm::train {
namespace {

namespace fs = std::filesystem;

model::ModelConfig small_config(uint64_t seed) {
  return {.seq_len = 8, .model_dim = 16, .num_heads = 4, .num_layers = 2, .ffn_hidden = 32,
          .moe_every = 2, .experts = 4, .expert_hidden = 16, .topk = 2,
          .capacity_factor = "4.0", .seed = seed};
}

// A sharded layout of this world size (mp and esp split tensors; 1 rank: nothing to split).
std::unique_ptr<Topology> sharded_topology() {
  const int p = test::world_size();
  const int mp = p % 2 == 0 ? 2 : 1;
  return test::make_topology(mp, p % 4 == 0 ? 2 : 1, mp, 60.0);
}

// A folder every rank names the same: world rank 0 makes it and broadcasts its name.
std::string shared_folder(Communicator& world) {
  std::string path(256, '\0');
  if (world.rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "parm-ckpt-XXXXXX").string();
    PARM_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path.replace(0, tmpl.size(), tmpl);
  }
  world.broadcast(path.data(), path.size(), DType::kU8, 0);
  return path.c_str();
}

struct Trained {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<AdamW> opt;
};

Trained make(Topology& topo, uint64_t seed, OptimizerSharding sharding) {
  Trained t;
  t.model = model::make_model(topo, small_config(seed), {{schedule::Kind::kS1, false, 1}}, 2);
  t.opt = std::make_unique<AdamW>(topo, t.model->params(), sharding);
  // Distinct moments, and a -0.0 that a float sum would turn into +0.0.
  Moments moments;
  for (size_t i = 0; i < t.model->params().size(); ++i) {
    Tensor m(t.model->params()[i]->value.shape()), v(m.shape());
    for (int64_t j = 0; j < m.numel(); ++j) m[j] = static_cast<float>(seed + i) + 0.25f * j;
    v.fill(static_cast<float>(seed) * 0.5f);
    moments.m.push_back(m);
    moments.v.push_back(v);
    t.model->params()[i]->value[0] = -0.0f;
  }
  t.opt->scatter_moments(moments);
  t.opt->set_steps_taken(7);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
}

// Two models on a sharded layout (a saves, b loads) and a save dir every rank names alike;
// the parameter says which of them shards its optimizer state over dp and edp.
using ShardingPair = std::pair<OptimizerSharding, OptimizerSharding>;
class Checkpoint : public ::testing::TestWithParam<ShardingPair> {
 protected:
  Checkpoint()
      : topo(sharded_topology()), world(topo->host_comm(Group::kWorld)),
        dir(shared_folder(world)), a(make(*topo, 1, GetParam().first)),
        b(make(*topo, 2, GetParam().second)) {}
  ~Checkpoint() override {
    world.barrier();
    if (world.rank() == 0) fs::remove_all(dir);
  }
  std::unique_ptr<Topology> topo;
  Communicator& world;
  const std::string dir;
  const nlohmann::json cfg = {{"seed", 1}};
  Trained a, b;
};

TEST_P(Checkpoint, SaveAndLoadGoOverTheWorldCommunicatorBitExact) {
  const size_t num_tensors = 3 * a.model->params().size();

  topo->reset_stats();
  save_checkpoint(*topo, dir, a.model->all_param_specs(), a.model->params(), *a.opt,
                  {7, 40, cfg});
  // One gather per tensor, rank 0's verdict on the folder, the closing barrier.
  EXPECT_EQ(world.stats().op(CommOp::kAllReduce).calls, static_cast<int64_t>(num_tensors));
  EXPECT_GE(world.stats().op(CommOp::kBroadcast).calls, 1);
  EXPECT_EQ(world.stats().op(CommOp::kBarrier).calls, 1);

  topo->reset_stats();
  const CheckpointState st =
      load_checkpoint(*topo, dir, b.model->all_param_specs(), b.model->params(), *b.opt, cfg);
  EXPECT_GE(world.stats().op(CommOp::kBroadcast).calls, static_cast<int64_t>(num_tensors));
  EXPECT_EQ(st.step, 7);
  EXPECT_EQ(st.data_position, 40);
  EXPECT_EQ(b.opt->steps_taken(), 7);
  const Moments ma = a.opt->gather_moments(), mb = b.opt->gather_moments();
  for (size_t i = 0; i < a.model->params().size(); ++i) {
    const auto& name = a.model->params()[i]->name;
    EXPECT_TRUE(same_bits(a.model->params()[i]->value, b.model->params()[i]->value)) << name;
    EXPECT_TRUE(same_bits(ma.m[i], mb.m[i])) << name;
    EXPECT_TRUE(same_bits(ma.v[i], mb.v[i])) << name;
    EXPECT_TRUE(std::signbit(b.model->params()[i]->value[0])) << name << ": -0.0 lost its sign";
  }
}

// A manifest whose `bytes` says more than the shape holds, with a file of that size and a
// matching checksum: the loader used to copy the whole file into the shape-sized buffer.
TEST_P(Checkpoint, BytesThatDisagreeWithTheShapeAreRefusedOnEveryRank) {
  const std::string folder =
      save_checkpoint(*topo, dir, a.model->all_param_specs(), a.model->params(), *a.opt,
                      {7, 24, cfg});
  b.opt->set_steps_taken(9);
  std::string tensor;
  if (world.rank() == 0) {
    nlohmann::json m = nlohmann::json::parse(read_file(folder + "/manifest.json"));
    auto& t = m["tensors"][0];
    tensor = t["name"].get<std::string>() + "/" + t["kind"].get<std::string>();
    const std::string file = folder + "/" + t["file"].get<std::string>();
    const std::string big = read_file(file) + std::string(1 << 16, '\x41');
    write_file_atomic(file, big);
    t["bytes"] = big.size();
    t["fnv1a64"] = fnv1a64_hex(big.data(), big.size());
    write_file_atomic(folder + "/manifest.json", m.dump(1));
  }
  world.barrier();
  std::string msg;
  try {
    load_checkpoint(*topo, folder, b.model->all_param_specs(), b.model->params(), *b.opt, cfg);
  } catch (const InvalidConfig& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("field 'bytes'"), std::string::npos) << "message: " << msg;
  if (world.rank() == 0) EXPECT_NE(msg.find(tensor), std::string::npos) << msg;
  // Refused before anything was overwritten.
  const Moments ma = a.opt->gather_moments(), mb = b.opt->gather_moments();
  for (size_t i = 0; i < b.model->params().size(); ++i) EXPECT_FALSE(same_bits(ma.m[i], mb.m[i]));
  EXPECT_EQ(b.opt->steps_taken(), 9);
}

constexpr auto kNone = OptimizerSharding::kNone;
constexpr auto kDp = OptimizerSharding::kDp;
INSTANTIATE_TEST_SUITE_P(Sharding, Checkpoint,
                         ::testing::Values(std::pair{kNone, kNone}, std::pair{kDp, kDp},
                                           std::pair{kDp, kNone}, std::pair{kNone, kDp}),
                         [](const auto& info) {
                           return fmt::format("{}_to_{}",
                                              optimizer_sharding_name(info.param.first),
                                              optimizer_sharding_name(info.param.second));
                         });

}  // namespace
}  // namespace parm::train
