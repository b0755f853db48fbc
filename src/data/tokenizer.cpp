#include "data/tokenizer.h"

#include <filesystem>

#include "data/checksum.h"
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

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return byte_tokenizer();
  throw InvalidConfig(fmt::format("tokenizer '{}': valid tokenizers are \"byte\"", spec));
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
    t = load_tokenizer((std::filesystem::path(folder) / rel).string());
  }
  check_same_tokenizer(t->identity(), fmt::format("the tokenizer file of {}", origin), record,
                       fmt::format("{}'s record", origin));
  return t;
}

}  // namespace parm::data
