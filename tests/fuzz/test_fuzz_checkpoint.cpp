// The checkpoint loader's single-process part (train/checkpoint_manifest.h) against 2,400
// mutated checkpoints: manifests changed structurally (wrong types, huge and negative
// numbers, missing keys, duplicated and renamed entries, paths out of the folder) and byte
// by byte, tensor files flipped, truncated, extended, removed or replaced by folders, and
// `latest` files that point anywhere. Each is refused with InvalidConfig or loads tensors of
// the model's shapes whose bytes match their checksums.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "fuzz_util.h"
#include "parm/fileio.h"
#include "train/checkpoint_manifest.h"

namespace parm::train {
namespace {

namespace fs = std::filesystem;

struct Pristine {
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> files;  // relative path -> bytes
  nlohmann::json manifest;
  nlohmann::json model_config = {{"arch", "gpt2"}, {"model_dim", 4}, {"seed", 3}};
};

Pristine make_pristine() {
  Pristine p;
  const std::vector<std::pair<std::string, Shape>> params = {
      {"blocks.0.attn.weight", {4, 3}}, {"blocks.0.ln.gain", {3}}, {"head.bias", {2, 1, 2}}};
  fuzz::Rng rng(7);
  nlohmann::json tensors = nlohmann::json::array();
  int index = 0;
  for (const auto& [name, shape] : params) {
    for (const char* kind : {"param", "adam_m", "adam_v"}) {
      TensorSpec s{name, kind, shape, fmt::format("tensors/{:04d}.{}.bin", index, kind)};
      std::vector<float> data(static_cast<size_t>(shape_numel(shape)));
      for (float& v : data) v = static_cast<float>(static_cast<int64_t>(rng.below(200)) - 100) / 8;
      tensors.push_back(tensor_entry(s, data.data()));
      p.files[s.file] = std::string(reinterpret_cast<const char*>(data.data()),
                                    data.size() * sizeof(float));
      p.specs.push_back(s);
    }
    ++index;
  }
  Manifest header;
  header.step = 6;
  header.optimizer_steps = 6;
  header.data_position = 96;
  header.model_config = p.model_config;
  header.model_config["extra_saved_key"] = 1;  // saved keys the model does not compare
  p.manifest = manifest_json(header, {{"world", 4}, {"mp", 2}, {"ep", 2}, {"esp", 1}}, tensors);
  return p;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// What load_checkpoint does on world rank 0, in one process: resolve, read, validate, then
// read and check each tensor. Returns the whole tensors.
std::vector<Tensor> load(const std::string& path, const Pristine& p) {
  const std::string folder = resolve_checkpoint_folder(path);
  const Manifest m = validate_manifest(read_manifest_json(folder), folder, p.specs,
                                       p.model_config, file_sizes_in(folder));
  std::vector<Tensor> out;
  for (const TensorRecord& t : m.tensors) {
    Tensor whole(t.spec.shape);
    read_tensor_file(folder, t, whole);
    out.push_back(std::move(whole));
  }
  EXPECT_GE(m.step, m.optimizer_steps);
  EXPECT_GE(m.data_position, 0);
  return out;
}

TEST(FuzzCheckpoint, PristineLoads) {
  const Pristine p = make_pristine();
  fuzz::TempDir dir;
  const std::string ck = dir.path() + "/step-00000006";
  fs::create_directories(ck + "/tensors");
  write(ck + "/manifest.json", p.manifest.dump(1));
  for (const auto& [f, bytes] : p.files) write(ck + "/" + f, bytes);
  write(dir.path() + "/latest", "step-00000006\n");
  const auto tensors = load(dir.path(), p);
  ASSERT_EQ(tensors.size(), p.specs.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    EXPECT_EQ(std::memcmp(tensors[i].data(), p.files.at(p.specs[i].file).data(),
                          p.files.at(p.specs[i].file).size()),
              0);
}

// The defect this loader had: `bytes` larger than the shape, with a file of that size and a
// matching checksum, was copied into a buffer sized by the shape.
TEST(FuzzCheckpoint, BytesLargerThanTheShapeAreRefusedNamingTheField) {
  Pristine p = make_pristine();
  fuzz::TempDir dir;
  fs::create_directories(dir.path() + "/tensors");
  auto& t = p.manifest["tensors"][0];
  std::string big = p.files.at(t["file"]) + std::string(4096, '\x7f');
  t["bytes"] = big.size();
  t["fnv1a64"] = fnv1a64_hex(big.data(), big.size());
  p.files[t["file"]] = big;
  write(dir.path() + "/manifest.json", p.manifest.dump());
  for (const auto& [f, bytes] : p.files) write(dir.path() + "/" + f, bytes);
  try {
    load(dir.path(), p);
    FAIL() << "accepted";
  } catch (const InvalidConfig& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("field 'bytes'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocks.0.attn.weight/param"), std::string::npos) << msg;
    EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  }
}

TEST(FuzzCheckpoint, MutatedCheckpointsAreRefusedOrLoadValidState) {
  const Pristine p = make_pristine();
  const std::string pristine_text = p.manifest.dump(1);
  fuzz::TempDir dir;
  const std::string ck = dir.path() + "/ck";
  fuzz::Rng rng(20240601);
  constexpr int kCases = 2400;
  int accepted = 0, refused = 0, other = 0;
  for (int c = 0; c < kCases; ++c) {
    fs::remove_all(dir.path() + "/ck");
    fs::remove(dir.path() + "/latest");
    fs::create_directories(ck + "/tensors");
    std::string what = fmt::format("case {}:", c);
    // The manifest: structural changes, or byte changes of its text, or both, or neither.
    nlohmann::json m = p.manifest;
    std::string text;
    const size_t kind = rng.below(10);
    if (kind < 5) {
      for (size_t n = 1 + rng.below(3); n > 0; --n) what += " " + fuzz::mutate_json(rng, m);
    } else if (kind == 5) {  // entries that collide or point elsewhere
      auto& ts = m["tensors"];
      const size_t a = rng.below(ts.size()), b = rng.below(ts.size());
      const char* field = rng.chance(50) ? "name" : "file";
      ts[a][field] = ts[b][field];
      if (rng.chance(30)) ts[a]["file"] = rng.chance(50) ? "tensors/../../x" : "/etc/passwd";
      what += fmt::format(" {} of entry {} = entry {}'s", field, a, b);
    }
    text = m.dump(1);
    if (kind == 6 || kind == 7) what += " manifest " + fuzz::mutate_bytes(rng, text);
    write(ck + "/manifest.json", text);
    // The tensor files.
    bool files_changed = false;
    for (const auto& [f, bytes] : p.files) {
      std::string b = bytes;
      if (kind >= 7 && rng.chance(15)) {
        files_changed = true;
        switch (rng.below(4)) {
          case 0:
            continue;  // missing
          case 1:
            fs::create_directories(ck + "/" + f);  // a folder where a file should be
            what += " " + f + " is a folder";
            continue;
          default:
            what += " " + f + " " + fuzz::mutate_bytes(rng, b);
        }
      }
      write(ck + "/" + f, b);
    }
    // Load the folder itself, or through `latest` (sometimes mangled).
    std::string path = ck;
    if (rng.chance(30)) {
      std::string latest = "ck\n";
      if (rng.chance(30)) what += " latest " + fuzz::mutate_bytes(rng, latest);
      write(dir.path() + "/latest", latest);
      path = dir.path();
    }
    std::vector<Tensor> loaded;
    if (fuzz::accepted_or_refused([&] { loaded = load(path, p); }, what, other)) {
      ++accepted;
      ASSERT_EQ(loaded.size(), p.specs.size()) << what;
      for (size_t i = 0; i < loaded.size(); ++i) {
        ASSERT_EQ(loaded[i].shape(), p.specs[i].shape) << what;
        // Checksums passed: unless the files changed, these are the saved bytes.
        if (!files_changed && text == pristine_text) {
          const std::string& want = p.files.at(p.specs[i].file);
          ASSERT_EQ(std::memcmp(loaded[i].data(), want.data(), want.size()), 0) << what;
        }
      }
    } else {
      ++refused;
    }
  }
  fuzz::expect_outcomes("checkpoint", kCases, accepted, refused, other);
}

}  // namespace
}  // namespace parm::train
