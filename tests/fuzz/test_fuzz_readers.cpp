// The JSON readers a user hands files to: the training config (train/train_config.h) and the
// cost-model profile (perfmodel/profile.h), each against 2,400 mutated files made from valid
// ones (wrong types, huge, negative and fractional numbers, missing, unknown and renamed
// keys, and byte-level damage). Each is refused with InvalidConfig or yields a value that
// passes the reader's own validation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "parm/fileio.h"
#include "perfmodel/profile.h"
#include "train/train_config.h"

namespace parm {
namespace {

namespace fs = std::filesystem;
constexpr int kCases = 2400;

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Mutates `base` (structurally, byte-wise, or both) into the file at `path`; returns what it did.
std::string write_mutant(fuzz::Rng& rng, const nlohmann::json& base, const std::string& path) {
  nlohmann::json j = base;
  std::string what;
  const size_t kind = rng.below(4);
  if (kind != 1)
    for (size_t n = 1 + rng.below(3); n > 0; --n) what += " " + fuzz::mutate_json(rng, j);
  std::string text = j.dump(2);
  if (kind == 1 || (kind == 2 && rng.chance(30))) what += " text " + fuzz::mutate_bytes(rng, text);
  write(path, text);
  return what;
}

TEST(FuzzReaders, TrainConfigsAreRefusedOrValid) {
  std::vector<nlohmann::json> bases;
  for (const char* name : {"gpt2-moe-tiny", "bert-moe-tiny", "gpt2-small-moe", "bert-base-moe"})
    bases.push_back(nlohmann::json::parse(
        read_file(fmt::format("{}/configs/{}.json", PARM_SOURCE_DIR, name))));
  fuzz::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  fuzz::Rng rng(11);
  int accepted = 0, refused = 0, other = 0;
  for (int c = 0; c < kCases; ++c) {
    const auto& base = bases[rng.below(bases.size())];
    const std::string what = fmt::format("case {}:{}", c, write_mutant(rng, base, path));
    train::TrainConfig cfg;
    if (fuzz::accepted_or_refused(
            [&] {
              cfg = train::load_train_config(path);
              train::validate(cfg);
            },
            what, other)) {
      ++accepted;
      // What validate promises.
      EXPECT_GE(cfg.model.seq_len, 1) << what;
      EXPECT_EQ(cfg.model.model_dim % cfg.model.num_heads, 0) << what;
      EXPECT_TRUE(std::isfinite(cfg.optim.lr) && cfg.optim.lr > 0) << what;
      EXPECT_TRUE(cfg.model.topk >= 1 && cfg.model.topk <= cfg.model.experts) << what;
    } else {
      ++refused;
    }
  }
  fuzz::expect_outcomes("train config", kCases, accepted, refused, other);
}

perfmodel::Profile sample_profile() {
  using namespace perfmodel;
  Profile p;
  p.machine = {{"hostname", "fuzz"}, {"cores", 2}};
  for (int l = 0; l < kNumLinks; ++l)
    for (size_t o = 0; o < kModelOps.size(); ++o) {
      CommFit& f = p.comm[static_cast<size_t>(l)][o];
      f.alpha_us = 3.0 + static_cast<double>(o);
      f.beta_us_per_byte = 1e-3 * (1 + l);
      f.r2 = 0.99;
      f.samples = 12;
      f.alpha_per_rank_us = 0.5;
      f.group_sizes = {2, 4};
      f.source = "measured";
    }
  p.fused.overlap = 0.5;
  p.fused.per_piece_us = 4.0;
  for (auto& g : p.gemm) g.gflops = 50.0;
  for (auto& m : p.mem) m.gbps = 10.0;
  return p;
}

TEST(FuzzReaders, CostProfilesAreRefusedOrValid) {
  const nlohmann::json base = perfmodel::profile_to_json(sample_profile());
  fuzz::TempDir dir;
  const std::string path = dir.path() + "/profile.json";
  fuzz::Rng rng(13);
  int accepted = 0, refused = 0, other = 0;
  for (int c = 0; c < kCases; ++c) {
    const std::string what = fmt::format("case {}:{}", c, write_mutant(rng, base, path));
    perfmodel::Profile p;
    if (fuzz::accepted_or_refused([&] { p = perfmodel::read_profile(path); }, what, other)) {
      ++accepted;
      // A profile read back is one the reader accepts again, every time a finite number.
      EXPECT_NO_THROW(perfmodel::profile_from_json(perfmodel::profile_to_json(p), "again"))
          << what;
      for (const auto& link : p.comm)
        for (const auto& f : link)
          EXPECT_TRUE(std::isfinite(f.alpha_us) && std::isfinite(f.beta_us_per_byte)) << what;
    } else {
      ++refused;
    }
  }
  fuzz::expect_outcomes("cost profile", kCases, accepted, refused, other);
}

}  // namespace
}  // namespace parm
