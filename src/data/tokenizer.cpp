#include "data/tokenizer.h"

#include <filesystem>

#include "data/checksum.h"
#include "data/sentencepiece_tokenizer.h"
#include "parm/error.h"
#include "parm/fileio.h"

namespace parm::data {

std::string Tokenizer::checksum() const {
  const std::string& b = model_bytes();
  return b.empty() ? "" : hex64(fnv1a64(b.data(), b.size()));
}

nlohmann::json Tokenizer::identity() const {
  nlohmann::json j = {{"kind", kind()}, {"vocab", vocab_size()}};
  if (!model_bytes().empty()) j["fnv1a64"] = checksum();
  return j;
}

nlohmann::json Tokenizer::record(const std::string& file) const {
  nlohmann::json j = identity();
  if (!file.empty()) j["file"] = file;
  return j;
}

namespace {

std::string read_model_file(const std::string& path) {
  std::error_code ec;
  PARM_CONFIG_CHECK(std::filesystem::is_regular_file(path, ec),
                    "tokenizer '{}' is neither \"byte\" nor a file (a SentencePiece .model: "
                    "make one with parm tokenizer train)",
                    path);
  const auto size = std::filesystem::file_size(path, ec);
  PARM_CONFIG_CHECK(!ec && size <= (256u << 20),
                    "tokenizer {}: {} bytes, more than a tokenizer model can be (256 MiB)", path,
                    ec ? 0 : size);
  try {
    return read_file(path);
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("tokenizer {}: {}", path, e.what()));
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return byte_tokenizer();
  return sentencepiece_tokenizer(read_model_file(spec), spec);
}

namespace {

// "byte" or "sentencepiece, vocabulary V, fnv1a64 H" for a record, in messages.
std::string shown(const nlohmann::json& r) {
  if (!r.is_object()) return r.dump();
  std::string s = r.value("kind", std::string("?"));
  if (r.contains("vocab")) s += fmt::format(", vocabulary {}", r.at("vocab").dump());
  if (r.contains("fnv1a64")) s += fmt::format(", fnv1a64 {}", r.at("fnv1a64").dump());
  return s;
}

nlohmann::json without_file(nlohmann::json r) {
  if (r.is_object()) r.erase("file");
  return r;
}

}  // namespace

void check_same_tokenizer(const nlohmann::json& a, const std::string& what_a,
                          const nlohmann::json& b, const std::string& what_b) {
  PARM_CONFIG_CHECK(without_file(a) == without_file(b),
                    "{} uses tokenizer ({}) but {} uses tokenizer ({}); they must be the same",
                    what_a, shown(a), what_b, shown(b));
}

std::unique_ptr<Tokenizer> tokenizer_from_record(const nlohmann::json& record,
                                                 const std::string& folder,
                                                 const std::string& origin) {
  if (record.is_null()) return byte_tokenizer();
  PARM_CONFIG_CHECK(record.is_object() && record.contains("kind") && record.at("kind").is_string(),
                    "{}: its tokenizer record {} has no \"kind\"", origin, record.dump());
  std::unique_ptr<Tokenizer> t;
  const std::string kind = record.at("kind").get<std::string>();
  if (kind == "byte") {
    t = byte_tokenizer();
  } else {
    PARM_CONFIG_CHECK(record.contains("file") && record.at("file").is_string(),
                      "{}: its {} tokenizer record has no \"file\"", origin, kind);
    const std::string file = record.at("file").get<std::string>();
    const std::filesystem::path rel(file);
    PARM_CONFIG_CHECK(!file.empty() && rel.is_relative() && rel.filename() == rel,
                      "{}: tokenizer file '{}' must be a plain file name in its folder", origin,
                      file);
    const std::string path = (std::filesystem::path(folder) / rel).string();
    std::string bytes = read_model_file(path);
    // The checksum before the parser sees the bytes.
    const std::string sum = hex64(fnv1a64(bytes.data(), bytes.size()));
    PARM_CONFIG_CHECK(record.contains("fnv1a64") && record.at("fnv1a64") == sum,
                      "{}: tokenizer file {} has fnv1a64 {} but the record says {} (the file "
                      "was changed or is corrupt)",
                      origin, path, sum, record.value("fnv1a64", nlohmann::json()).dump());
    t = sentencepiece_tokenizer(std::move(bytes), path);
  }
  check_same_tokenizer(t->identity(), fmt::format("the tokenizer file of {}", origin), record,
                       fmt::format("{}'s record", origin));
  return t;
}

}  // namespace parm::data
