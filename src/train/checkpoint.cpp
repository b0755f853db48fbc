#include "train/checkpoint.h"

#include <mpi.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "comm/mpi_check.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "train/shard.h"

namespace parm::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "parm-checkpoint";
constexpr int kVersion = 1;
int g_crash_after_files = -1;

std::string fnv1a64(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// Rank 0 decides; every rank learns the outcome (so that no rank is left waiting when rank 0
// refuses a checkpoint).
void agree(const std::string& error_on_root) {
  int len = static_cast<int>(error_on_root.size());
  PARM_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (len == 0) return;
  std::string msg(static_cast<size_t>(len), ' ');
  if (!error_on_root.empty()) msg = error_on_root;
  PARM_MPI_CHECK(MPI_Bcast(msg.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD));
  throw InvalidConfig(msg);
}

struct Entry {
  std::string name, kind, file;
  Tensor* local;
  const model::Param* param;
};

std::vector<Entry> entries(const std::vector<model::Param*>& params, AdamW& opt) {
  std::vector<Entry> out;
  for (size_t i = 0; i < params.size(); ++i) {
    auto* p = params[i];
    const std::string base = fmt::format("{:04d}", i);
    out.push_back({p->name, "param", "tensors/" + base + ".param.bin", &p->value, p});
    out.push_back({p->name, "adam_m", "tensors/" + base + ".adam_m.bin", &opt.first_moments()[i], p});
    out.push_back({p->name, "adam_v", "tensors/" + base + ".adam_v.bin", &opt.second_moments()[i], p});
  }
  return out;
}

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (fs::exists(latest)) {
    std::string name = read_file(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return (fs::path(path) / name).string();
  }
  throw InvalidConfig(fmt::format(
      "no checkpoint at {}: expected a checkpoint folder with manifest.json or a save dir "
      "with a `latest` file",
      path));
}

}  // namespace

void set_checkpoint_crash_after_files(int n) { g_crash_after_files = n; }

std::string save_checkpoint(Topology& topo, const std::string& save_dir,
                            const std::vector<model::Param*>& params, AdamW& optimizer,
                            const CheckpointState& state) {
  const bool root = topo.world_rank() == 0;
  const std::string name = fmt::format("step-{:08d}", state.step);
  const fs::path final_dir = fs::path(save_dir) / name;
  const fs::path tmp_dir = fs::path(save_dir) / (name + ".tmp");
  std::string error;
  if (root) {
    try {
      fs::create_directories(save_dir);
      fs::remove_all(tmp_dir);  // a crashed earlier attempt
      fs::create_directories(tmp_dir / "tensors");
    } catch (const std::exception& e) {
      error = fmt::format("cannot create checkpoint folder {}: {}", tmp_dir.string(), e.what());
    }
  }
  agree(error);
  nlohmann::json tensors = nlohmann::json::array();
  int written = 0;
  for (const Entry& e : entries(params, optimizer)) {
    const Tensor whole = gather_whole(topo, *e.param, *e.local);
    if (!root) continue;
    if (g_crash_after_files >= 0 && written >= g_crash_after_files)
      throw Error(fmt::format("simulated crash while saving {} (test hook)", name));
    const size_t bytes = static_cast<size_t>(whole.bytes());
    write_file_atomic((tmp_dir / e.file).string(),
                      std::string(reinterpret_cast<const char*>(whole.data()), bytes));
    ++written;
    tensors.push_back({{"name", e.name}, {"kind", e.kind}, {"file", e.file},
                       {"shape", e.param->whole_shape}, {"dtype", "float32"}, {"bytes", bytes},
                       {"fnv1a64", fnv1a64(whole.data(), bytes)}});
  }
  if (root) {
    const nlohmann::json manifest = {{"format", kFormat},
                                     {"version", kVersion},
                                     {"step", state.step},
                                     {"optimizer_steps", optimizer.steps_taken()},
                                     {"data_position", state.data_position},
                                     {"model_config", state.model_config},
                                     {"saved_from_layout",
                                      {{"world", topo.layout().world},
                                       {"mp", topo.layout().mp},
                                       {"ep", topo.layout().ep},
                                       {"esp", topo.layout().esp}}},
                                     {"tensors", tensors}};
    write_file_atomic((tmp_dir / "manifest.json").string(), manifest.dump(1) + "\n");
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir);
    write_file_atomic((fs::path(save_dir) / "latest").string(), name + "\n");
  }
  PARM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  return final_dir.string();
}

CheckpointState load_checkpoint(Topology& topo, const std::string& path,
                                const std::vector<model::Param*>& params, AdamW& optimizer,
                                const nlohmann::json& model_config) {
  const bool root = topo.world_rank() == 0;
  std::string error, dir;
  nlohmann::json manifest;
  if (root) {
    try {
      dir = resolve(path);
      try {
        manifest = nlohmann::json::parse(read_file((fs::path(dir) / "manifest.json").string()));
      } catch (const nlohmann::json::exception& e) {
        throw InvalidConfig(fmt::format("{}/manifest.json is not valid JSON: {}", dir, e.what()));
      }
      if (manifest.value("format", "") != kFormat || manifest.value("version", 0) != kVersion)
        throw InvalidConfig(fmt::format(
            "{}/manifest.json is not a {} version {} manifest (format '{}', version {})", dir,
            kFormat, kVersion, manifest.value("format", "?"), manifest.value("version", 0)));
      const auto& saved = manifest.at("model_config");
      for (const auto& [key, value] : model_config.items())
        if (!saved.contains(key) || saved.at(key) != value)
          throw InvalidConfig(fmt::format(
              "checkpoint {} was saved for a different model: model.{} is {} there but {} now",
              dir, key, saved.contains(key) ? saved.at(key).dump() : "missing", value.dump()));
      // Every tensor: present, right shape, complete, intact.
      std::map<std::string, nlohmann::json> by_key;
      for (const auto& t : manifest.at("tensors"))
        by_key[t.at("name").get<std::string>() + "/" + t.at("kind").get<std::string>()] = t;
      for (const Entry& e : entries(params, optimizer)) {
        const auto it = by_key.find(e.name + "/" + e.kind);
        if (it == by_key.end())
          throw InvalidConfig(fmt::format("checkpoint {} has no {} of parameter {}", dir, e.kind,
                                          e.name));
        const auto& t = it->second;
        if (t.at("shape").get<Shape>() != e.param->whole_shape)
          throw InvalidConfig(fmt::format("checkpoint {}: {} of {} has shape {}, the model needs {}",
                                          dir, e.kind, e.name, t.at("shape").dump(),
                                          shape_str(e.param->whole_shape)));
        const fs::path file = fs::path(dir) / t.at("file").get<std::string>();
        if (!fs::exists(file) || fs::file_size(file) != t.at("bytes").get<uint64_t>())
          throw InvalidConfig(fmt::format(
              "checkpoint {}: {} is missing or truncated ({} bytes, manifest says {})", dir,
              file.string(), fs::exists(file) ? fs::file_size(file) : 0,
              t.at("bytes").get<uint64_t>()));
        by_key.erase(it);
      }
      if (!by_key.empty())
        throw InvalidConfig(fmt::format("checkpoint {} holds tensors this model does not have, "
                                        "e.g. {}",
                                        dir, by_key.begin()->first));
    } catch (const InvalidConfig& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = fmt::format("cannot read checkpoint {}: {}", path, e.what());
    }
  }
  agree(error);

  // Tensors: rank 0 reads and checks each whole tensor, every rank takes its shard.
  std::string text = root ? manifest.dump() : std::string();
  int len = static_cast<int>(text.size());
  PARM_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD));
  text.resize(static_cast<size_t>(len));
  PARM_MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD));
  manifest = nlohmann::json::parse(text);
  std::map<std::string, nlohmann::json> by_key;
  for (const auto& t : manifest.at("tensors"))
    by_key[t.at("name").get<std::string>() + "/" + t.at("kind").get<std::string>()] = t;
  std::vector<std::pair<Tensor*, Tensor>> loaded;
  for (const Entry& e : entries(params, optimizer)) {
    const auto& t = by_key.at(e.name + "/" + e.kind);
    Tensor whole(e.param->whole_shape);
    error.clear();
    if (root) {
      const std::string file = (fs::path(dir) / t.at("file").get<std::string>()).string();
      const std::string bytes = read_file(file);
      if (fnv1a64(bytes.data(), bytes.size()) != t.at("fnv1a64").get<std::string>())
        error = fmt::format("checkpoint {}: {} is corrupt (checksum mismatch)", dir, file);
      else
        std::memcpy(whole.data(), bytes.data(), bytes.size());  // size checked above
    }
    agree(error);
    PARM_MPI_CHECK(MPI_Bcast(whole.data(), static_cast<int>(whole.numel()), MPI_FLOAT, 0,
                             MPI_COMM_WORLD));
    Tensor local(e.local->shape());
    model::copy_shard_from_whole(whole, e.param->splits, local);
    loaded.emplace_back(e.local, std::move(local));
  }
  // Only now, with everything verified, overwrite the model and the optimizer.
  for (auto& [t, v] : loaded) t->copy_from(v);
  optimizer.set_steps_taken(manifest.at("optimizer_steps").get<int64_t>());
  CheckpointState st;
  st.step = manifest.at("step").get<int64_t>();
  st.data_position = manifest.at("data_position").get<int64_t>();
  st.model_config = manifest.at("model_config");
  return st;
}

}  // namespace parm::train
