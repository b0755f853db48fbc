#include "train/checkpoint.h"

#include <filesystem>
#include <map>

#include "core/fault.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "train/checkpoint_manifest.h"
#include "train/shard.h"

namespace parm::train {
namespace fs = std::filesystem;
namespace {

// World rank 0's `text` on every rank, over the world communicator.
std::string broadcast_text(Communicator& world, std::string text) {
  int64_t len = static_cast<int64_t>(text.size());
  world.broadcast(&len, 1, DType::kI64, 0);
  text.resize(static_cast<size_t>(len));
  world.broadcast(text.data(), text.size(), DType::kU8, 0);
  return text;
}

// Rank 0 decides; every rank learns the outcome (so that no rank is left waiting when rank 0
// refuses a checkpoint) and throws the same InvalidConfig.
void agree(Communicator& world, const std::string& error_on_root) {
  const std::string error = broadcast_text(world, error_on_root);
  if (!error.empty()) throw InvalidConfig(error);
}

// One tensor of the checkpoint; param and local are null on ranks of other pipeline stages.
struct Entry {
  TensorSpec spec;
  Tensor* local;
  const model::Param* param;
};

// `moments`: the optimizer's whole moments, in the order of `params`.
std::vector<Entry> entries(const std::vector<model::ParamSpec>& all,
                           const std::vector<model::Param*>& params, Moments& moments) {
  std::map<std::string, size_t> held;  // name -> index in params
  for (size_t i = 0; i < params.size(); ++i) held[params[i]->name] = i;
  PARM_CHECK(held.size() == params.size(), "parameter names are not unique");
  std::vector<Entry> out;
  for (size_t i = 0; i < all.size(); ++i) {
    const model::ParamSpec& ps = all[i];
    const auto it = held.find(ps.name);
    const model::Param* p = it == held.end() ? nullptr : params[it->second];
    PARM_CHECK(p == nullptr || p->whole_shape == ps.whole_shape,
               "parameter {} is {} here but {} in the model's list", ps.name,
               shape_str(p == nullptr ? Shape{} : p->whole_shape), shape_str(ps.whole_shape));
    const std::string base = fmt::format("tensors/{:04d}", i);
    auto add = [&](const char* kind, std::vector<Tensor>* moments) {
      Tensor* local = nullptr;
      if (p != nullptr)
        local = moments == nullptr ? &params[it->second]->value : &(*moments)[it->second];
      out.push_back({{ps.name, kind, ps.whole_shape, fmt::format("{}.{}.bin", base, kind)},
                     local, p});
    };
    add("param", nullptr);
    add("adam_m", &moments.m);
    add("adam_v", &moments.v);
  }
  return out;
}

std::vector<TensorSpec> specs(const std::vector<Entry>& es) {
  std::vector<TensorSpec> out;
  for (const Entry& e : es) out.push_back(e.spec);
  return out;
}

}  // namespace

std::string save_checkpoint(Topology& topo, const std::string& save_dir,
                            const std::vector<model::ParamSpec>& all,
                            const std::vector<model::Param*>& params, AdamW& optimizer,
                            const CheckpointState& state) {
  Communicator& world = topo.host_comm(Group::kWorld);
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
  agree(world, error);
  nlohmann::json tensors = nlohmann::json::array();
  int written = 0;
  // Gathered whole from the ranks that hold their shards (collective), like the parameters.
  Moments moments = optimizer.gather_moments();
  for (const Entry& e : entries(all, params, moments)) {
    const Tensor whole = gather_whole(topo, e.spec.shape, e.param, e.local);
    if (!root) continue;
    fault::before_checkpoint_file(written, name);
    const size_t bytes = static_cast<size_t>(whole.bytes());
    write_file_atomic((tmp_dir / e.spec.file).string(),
                      std::string(reinterpret_cast<const char*>(whole.data()), bytes));
    ++written;
    tensors.push_back(tensor_entry(e.spec, whole.data()));
  }
  if (root) {
    const Layout& l = topo.layout();
    Manifest header;
    header.step = state.step;
    header.optimizer_steps = optimizer.steps_taken();
    header.data_position = state.data_position;
    header.model_config = state.model_config;
    header.router_bias = state.router_bias;
    header.tokenizer = state.tokenizer;
    if (!state.tokenizer_bytes.empty()) {
      write_file_atomic((tmp_dir / kCheckpointTokenizerFile).string(), state.tokenizer_bytes);
      header.tokenizer["file"] = kCheckpointTokenizerFile;
    }
    const nlohmann::json layout = {{"world", l.world}, {"mp", l.mp}, {"ep", l.ep},
                                   {"esp", l.esp},     {"pp", l.pp}};
    write_file_atomic((tmp_dir / "manifest.json").string(),
                      manifest_json(header, layout, std::move(tensors)).dump(1) + "\n");
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir);
    write_file_atomic((fs::path(save_dir) / "latest").string(), name + "\n");
  }
  world.barrier();
  return final_dir.string();
}

CheckpointState load_checkpoint(Topology& topo, const std::string& path,
                                const std::vector<model::ParamSpec>& all,
                                const std::vector<model::Param*>& params, AdamW& optimizer,
                                const nlohmann::json& model_config,
                                const nlohmann::json& tokenizer) {
  Communicator& world = topo.host_comm(Group::kWorld);
  const bool root = topo.world_rank() == 0;
  // Loaded whole, then each rank keeps its shard (AdamW::scatter_moments).
  Moments moments;
  for (const model::Param* p : params) {
    moments.m.emplace_back(p->value.shape());
    moments.v.emplace_back(p->value.shape());
  }
  const std::vector<Entry> es = entries(all, params, moments);
  std::string error, folder;
  Manifest manifest;
  if (root) {
    // Every field checked against every other, the model and the files' sizes, before any
    // tensor data is read.
    try {
      folder = resolve_checkpoint_folder(path);
      manifest = validate_manifest(read_manifest_json(folder), folder, specs(es), model_config,
                                   file_sizes_in(folder), tokenizer);
    } catch (const InvalidConfig& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = fmt::format("cannot read checkpoint {}: {}", path, e.what());
    }
  }
  agree(world, error);
  const nlohmann::json header = nlohmann::json::parse(broadcast_text(
      world, root ? nlohmann::json{{"step", manifest.step},
                                   {"optimizer_steps", manifest.optimizer_steps},
                                   {"data_position", manifest.data_position},
                                   {"model_config", manifest.model_config},
                                   {"router_bias", manifest.router_bias},
                                   {"tokenizer", manifest.tokenizer}}
                        .dump()
                  : std::string()));

  // Tensors: rank 0 reads and checks each whole tensor, every rank takes its shard.
  std::vector<std::pair<Tensor*, Tensor>> loaded;
  for (size_t i = 0; i < es.size(); ++i) {
    const Entry& e = es[i];
    Tensor whole(e.spec.shape);
    error.clear();
    if (root) {
      try {
        read_tensor_file(folder, manifest.tensors[i], whole);
      } catch (const InvalidConfig& ex) {
        error = ex.what();
      }
    }
    agree(world, error);
    world.broadcast(whole.data(), static_cast<size_t>(whole.numel()), DType::kF32, 0);
    if (e.local == nullptr) continue;  // another pipeline stage's
    if (e.spec.kind != "param") {  // a host tensor of `moments`, not yet the optimizer's
      model::copy_shard_from_whole(whole, e.param->splits, *e.local);
      continue;
    }
    Tensor local(e.local->shape());
    model::copy_shard_from_whole(whole, e.param->splits, local);
    loaded.emplace_back(e.local, std::move(local));
  }
  // Only now, with everything verified, overwrite the model and the optimizer.
  for (auto& [t, v] : loaded) t->copy_from(v);
  optimizer.scatter_moments(moments);
  optimizer.set_steps_taken(header.at("optimizer_steps").get<int64_t>());
  CheckpointState st;
  st.step = header.at("step").get<int64_t>();
  st.data_position = header.at("data_position").get<int64_t>();
  st.model_config = header.at("model_config");
  st.router_bias = header.at("router_bias");
  st.tokenizer = header.at("tokenizer");
  return st;
}

}  // namespace parm::train
