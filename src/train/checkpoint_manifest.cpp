#include "train/checkpoint_manifest.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "data/checksum.h"
#include "data/tokenizer.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "train/train_config.h"

namespace parm::train {
namespace fs = std::filesystem;
namespace {

// A manifest of a model with hundreds of layers is a few hundred KiB; this bounds what a
// corrupt one makes the loader read into memory.
constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr const char* kKinds[] = {"param", "adam_m", "adam_v"};

// Refusals that name the manifest, and the tensor entry when there is one.
class Refuser {
 public:
  explicit Refuser(const std::string& folder) : where_(folder + "/manifest.json") {}
  void at_tensor(size_t index, const std::string& name, const std::string& kind) {
    tensor_ = fmt::format(" tensor {} ({}{}{})", index, name.empty() ? "?" : name,
                          kind.empty() ? "" : "/", kind);
  }
  template <typename... Args>
  [[noreturn]] void fail(const char* field, fmt::format_string<Args...> f, Args&&... args) const {
    throw InvalidConfig(fmt::format("checkpoint {}:{} field '{}': {}", where_, tensor_, field,
                                    fmt::format(f, std::forward<Args>(args)...)));
  }

 private:
  std::string where_, tensor_;
};

// What a refusal prints of a value: its JSON, cut short.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

const nlohmann::json& field(const Refuser& r, const nlohmann::json& obj, const char* key) {
  if (!obj.contains(key)) r.fail(key, "missing");
  return obj.at(key);
}

int64_t whole_number(const Refuser& r, const nlohmann::json& obj, const char* key, int64_t min) {
  const auto& v = field(r, obj, key);
  if (!v.is_number_integer())
    r.fail(key, "must be a whole number, got {}", shown(v));
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    r.fail(key, "{} is out of range", shown(v));
  const int64_t i = v.get<int64_t>();
  if (i < min) r.fail(key, "{} is out of range: it must be >= {}", i, min);
  return i;
}

std::string text(const Refuser& r, const nlohmann::json& obj, const char* key) {
  const auto& v = field(r, obj, key);
  if (!v.is_string()) r.fail(key, "must be a string, got {}", shown(v));
  return v.get<std::string>();
}

// tensors/<name>, the name made of letters, digits, '.', '_' and '-' and not "." or "..":
// a file that stays inside the checkpoint folder.
bool safe_tensor_file(const std::string& file) {
  const std::string dir = "tensors/";
  if (file.size() <= dir.size() || file.compare(0, dir.size(), dir) != 0) return false;
  const std::string base = file.substr(dir.size());
  if (base == "." || base == ".." || base.size() > 255) return false;
  for (char c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// An integer JSON value equal to x (3.0 or "3" are not).
bool integer_equals(const nlohmann::json& v, int64_t x) {
  if (v.is_number_unsigned()) return x >= 0 && v.get<uint64_t>() == static_cast<uint64_t>(x);
  return v.is_number_integer() && v.get<int64_t>() == x;
}

bool hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string fnv1a64_hex(const void* data, size_t n) {
  return data::hex64(data::fnv1a64(data, n));
}

nlohmann::json tensor_entry(const TensorSpec& spec, const float* data) {
  const size_t bytes = static_cast<size_t>(shape_numel(spec.shape)) * sizeof(float);
  return {{"name", spec.name}, {"kind", spec.kind},       {"file", spec.file},
          {"shape", spec.shape}, {"dtype", "float32"},   {"bytes", bytes},
          {"fnv1a64", fnv1a64_hex(data, bytes)}};
}

nlohmann::json manifest_json(const Manifest& header, const nlohmann::json& saved_from_layout,
                             nlohmann::json tensors) {
  nlohmann::json m = {{"format", kCheckpointFormat},
                      {"version", kCheckpointVersion},
                      {"step", header.step},
                      {"optimizer_steps", header.optimizer_steps},
                      {"data_position", header.data_position},
                      {"model_config", header.model_config},
                      {"saved_from_layout", saved_from_layout},
                      {"tensors", std::move(tensors)}};
  if (!header.router_bias.is_null()) m["router_bias"] = header.router_bias;
  if (!header.tokenizer.is_null()) m["tokenizer"] = header.tokenizer;
  return m;
}

FileSizeFn file_sizes_in(const std::string& folder) {
  return [folder](const std::string& relative) -> std::optional<uint64_t> {
    std::error_code ec;
    const fs::path p = fs::path(folder) / relative;
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    const uint64_t n = fs::file_size(p, ec);
    if (ec) return std::nullopt;
    return n;
  };
}

std::string resolve_checkpoint_folder(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (fs::is_regular_file(latest, ec)) {
    std::string name = read_file(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    // One folder name beside `latest`, never a path that leads elsewhere.
    PARM_CONFIG_CHECK(!name.empty() && name != "." && name != ".." &&
                          name.find('/') == std::string::npos &&
                          name.find('\0') == std::string::npos && name.size() <= 255,
                      "checkpoint save dir {}: `latest` must name one of its checkpoint "
                      "folders (e.g. step-00000100), got '{}'",
                      path, name.substr(0, 80));
    return (fs::path(path) / name).string();
  }
  throw InvalidConfig(fmt::format(
      "no checkpoint at {}: expected a checkpoint folder with manifest.json or a save dir "
      "with a `latest` file",
      path));
}

nlohmann::json read_manifest_json(const std::string& folder) {
  const fs::path file = fs::path(folder) / "manifest.json";
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  PARM_CONFIG_CHECK(!ec, "checkpoint {}: cannot read manifest.json: {}", folder, ec.message());
  PARM_CONFIG_CHECK(size <= kMaxManifestBytes,
                    "checkpoint {}: manifest.json is {} bytes, more than a manifest can be "
                    "({} at most)",
                    folder, size, kMaxManifestBytes);
  try {
    return nlohmann::json::parse(read_file(file.string()));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidConfig(fmt::format("{}/manifest.json is not valid JSON: {}", folder, e.what()));
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("checkpoint {}: {}", folder, e.what()));
  }
}

Manifest validate_manifest(const nlohmann::json& m, const std::string& folder,
                           const std::vector<TensorSpec>& expected,
                           const nlohmann::json& model_config, const FileSizeFn& size_of,
                           const nlohmann::json& tokenizer) {
  Refuser r(folder);
  if (!m.is_object()) r.fail("(top level)", "must be a JSON object, got {}", shown(m));
  const auto& format = field(r, m, "format");
  const auto& version = field(r, m, "version");
  if (format != kCheckpointFormat || !integer_equals(version, kCheckpointVersion))
    r.fail("format", "this is not a {} version {} manifest (format {}, version {})",
           kCheckpointFormat, kCheckpointVersion, shown(format), shown(version));
  Manifest out;
  out.step = whole_number(r, m, "step", 0);
  out.optimizer_steps = whole_number(r, m, "optimizer_steps", 0);
  if (out.optimizer_steps > out.step)
    r.fail("optimizer_steps", "{} is more than the training steps done ({}, field 'step')",
           out.optimizer_steps, out.step);
  out.data_position = whole_number(r, m, "data_position", 0);

  // The tokenizer before the model: a model of another tokenizer has another vocabulary, and
  // the tokenizer is what to name.
  const nlohmann::json bytes = data::byte_tokenizer()->identity();
  out.tokenizer = bytes;
  if (m.contains("tokenizer")) {
    const auto& t = m.at("tokenizer");
    if (!t.is_object()) r.fail("tokenizer", "must be a JSON object, got {}", shown(t));
    text(r, t, "kind");
    whole_number(r, t, "vocab", 1);
    if (t.contains("file")) {
      const std::string file = text(r, t, "file");
      if (file != kCheckpointTokenizerFile)
        r.fail("tokenizer", "file '{}' must be {}", file.substr(0, 80), kCheckpointTokenizerFile);
      if (!size_of(file)) r.fail("tokenizer", "its file {} is missing", file);
    }
    out.tokenizer = t;
  }
  data::check_same_tokenizer(out.tokenizer, fmt::format("checkpoint {}", folder),
                             tokenizer.is_null() ? bytes : tokenizer, "this run");

  const auto& saved = field(r, m, "model_config");
  if (!saved.is_object()) r.fail("model_config", "must be a JSON object, got {}", shown(saved));
  for (const auto& [key, value] : model_config.items())
    if (!saved.contains(key) || saved.at(key) != value)
      throw InvalidConfig(fmt::format(
          "checkpoint {} was saved for a different model: model.{} is {} there but {} now",
          folder, key, saved.contains(key) ? shown(saved.at(key)) : "missing", shown(value)));
  // Keys written only where they differ from their default (the router's, expert_mlp): one
  // the checkpoint has and this model does not is a default here and something else there.
  // (Other saved keys the model does not write are not compared.)
  for (const std::string& key : model_keys_omitted_at_default())
    if (saved.contains(key) && !model_config.contains(key))
      throw InvalidConfig(fmt::format(
          "checkpoint {} was saved for a different model: model.{} is {} there but its "
          "default now",
          folder, key, shown(saved.at(key))));
  out.model_config = saved;
  if (m.contains("router_bias")) out.router_bias = m.at("router_bias");
  if (m.contains("saved_from_layout")) {
    const auto& l = m.at("saved_from_layout");
    if (!l.is_object())
      r.fail("saved_from_layout", "must be a JSON object, got {}", shown(l));
    for (const char* key : {"world", "mp", "ep", "esp"})
      if (l.contains(key)) whole_number(r, l, key, 1);
  }

  const auto& tensors = field(r, m, "tensors");
  if (!tensors.is_array()) r.fail("tensors", "must be a JSON list, got {}", shown(tensors));
  std::map<std::pair<std::string, std::string>, size_t> want;  // (name, kind) -> spec index
  for (size_t i = 0; i < expected.size(); ++i)
    want.emplace(std::make_pair(expected[i].name, expected[i].kind), i);
  std::vector<std::optional<TensorRecord>> found(expected.size());
  std::vector<size_t> found_at(expected.size());  // entry index of found[i]
  std::map<std::string, size_t> files;  // file -> entry index
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors.at(i);
    r.at_tensor(i, "", "");
    if (!t.is_object()) r.fail("tensors", "entry {} must be a JSON object, got {}", i, shown(t));
    const std::string name = text(r, t, "name");
    r.at_tensor(i, name.substr(0, 200), "");
    const std::string kind = text(r, t, "kind");
    if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds))
      r.fail("kind", "'{}' is not valid; valid kinds: param, adam_m, adam_v",
             kind.substr(0, 80));
    r.at_tensor(i, name.substr(0, 200), kind);
    const auto it = want.find({name, kind});
    if (it == want.end()) r.fail("name", "this model has no parameter of that name");
    if (found[it->second])
      r.fail("name", "listed twice (first as entry {})", found_at[it->second]);
    const TensorSpec& spec = expected[it->second];

    const auto& shape = field(r, t, "shape");
    if (!shape.is_array() || shape.size() != spec.shape.size())
      r.fail("shape", "{}, the model needs {}", shown(shape), shape_str(spec.shape));
    for (size_t d = 0; d < spec.shape.size(); ++d)
      if (!integer_equals(shape.at(d), spec.shape[d]))
        r.fail("shape", "{}, the model needs {}", shown(shape), shape_str(spec.shape));
    const std::string dtype = text(r, t, "dtype");
    if (dtype != "float32") r.fail("dtype", "'{}' is not float32", dtype.substr(0, 80));

    TensorRecord rec;
    rec.spec = spec;
    const uint64_t need = static_cast<uint64_t>(shape_numel(spec.shape)) * sizeof(float);
    const auto& bytes = field(r, t, "bytes");
    if (!bytes.is_number_unsigned() && !(bytes.is_number_integer() && bytes.get<int64_t>() >= 0))
      r.fail("bytes", "must be a whole number >= 0, got {}", shown(bytes));
    rec.bytes = bytes.get<uint64_t>();
    if (rec.bytes != need)
      r.fail("bytes", "{}, but shape {} of float32 is {} bytes", rec.bytes,
             shape_str(spec.shape), need);

    rec.spec.file = text(r, t, "file");
    if (!safe_tensor_file(rec.spec.file))
      r.fail("file", "'{}' is not a file name under tensors/ (letters, digits, '.', '_', '-')",
             rec.spec.file.substr(0, 80));
    const auto [at, fresh] = files.emplace(rec.spec.file, i);
    if (!fresh) r.fail("file", "'{}' is also the file of entry {}", rec.spec.file, at->second);
    rec.fnv1a64 = text(r, t, "fnv1a64");
    if (!hex16(rec.fnv1a64))
      r.fail("fnv1a64", "'{}' is not 16 lower-case hex digits", rec.fnv1a64.substr(0, 80));

    const auto on_disk = size_of(rec.spec.file);
    if (!on_disk || *on_disk != rec.bytes)
      throw InvalidConfig(fmt::format(
          "checkpoint {}: {}/{} ({}/{}) is missing or truncated ({} bytes, manifest says {})",
          folder, folder, rec.spec.file, name, kind, on_disk ? *on_disk : 0, rec.bytes));
    found[it->second] = std::move(rec);
    found_at[it->second] = i;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!found[i])
      throw InvalidConfig(fmt::format("checkpoint {} has no {} of parameter {}", folder,
                                      expected[i].kind, expected[i].name));
    out.tensors.push_back(std::move(*found[i]));
  }
  return out;
}

void read_tensor_file(const std::string& folder, const TensorRecord& t, Tensor& whole) {
  PARM_CHECK(whole.shape() == t.spec.shape, "tensor {}/{}: buffer {} for shape {}", t.spec.name,
             t.spec.kind, shape_str(whole.shape()), shape_str(t.spec.shape));
  const std::string file = (fs::path(folder) / t.spec.file).string();
  std::string bytes;
  try {
    bytes = read_file(file);
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("checkpoint {}: {}", folder, e.what()));
  }
  const uint64_t need = static_cast<uint64_t>(whole.numel()) * sizeof(float);
  if (bytes.size() != need || bytes.size() != t.bytes)
    throw InvalidConfig(fmt::format(
        "checkpoint {}: {} ({}/{}) is missing or truncated ({} bytes, manifest says {})", folder,
        file, t.spec.name, t.spec.kind, bytes.size(), t.bytes));
  if (fnv1a64_hex(bytes.data(), bytes.size()) != t.fnv1a64)
    throw InvalidConfig(fmt::format("checkpoint {}: {} ({}/{}) is corrupt (checksum mismatch)",
                                    folder, file, t.spec.name, t.spec.kind));
  if (need > 0) std::memcpy(whole.data(), bytes.data(), need);
}

}  // namespace parm::train
