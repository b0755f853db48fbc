#include "data/prepared_dataset.h"

#include <unistd.h>

#include <filesystem>
#include <limits>

#include "data/mapped_file.h"
#include "data/prepared_format.h"
#include "parm/error.h"
#include "parm/fileio.h"

namespace parm::data {
namespace {

namespace fs = std::filesystem;
constexpr const char* kDatasetJson = "dataset.json";
constexpr const char* kTokensFile = "tokens.bin";
constexpr const char* kTokenizerFile = "tokenizer.model";

std::string dtype_name(uint32_t width) { return width == 2 ? "uint16" : "uint32"; }

}  // namespace

EncodedText encode_documents(const Tokenizer& tokenizer, std::string_view text,
                             bool check_round_trip) {
  EncodedText out;
  for (std::string_view doc : split_documents(text)) {
    out.doc_starts.push_back(out.ids.size());
    const std::vector<int32_t> ids = tokenizer.encode(doc);
    if (check_round_trip && tokenizer.decode(ids) != doc) ++out.not_round_trip;
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  }
  return out;
}

void write_prepared(const std::string& dir, const Tokenizer& tokenizer,
                    const std::string& corpus_name, const EncodedText& text) {
  PARM_CONFIG_CHECK(!fs::exists(dir),
                    "prepare-data: {} exists; remove it or name another --out folder", dir);
  const fs::path target = fs::path(dir).lexically_normal();
  const fs::path tmp = target.string() + fmt::format(".tmp-{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const bool has_model = !tokenizer.model_bytes().empty();
  if (has_model) write_file_atomic((tmp / kTokenizerFile).string(), tokenizer.model_bytes());
  const auto vocab = static_cast<uint32_t>(tokenizer.vocab_size());
  const std::string bin = tokens_file_bytes(text.ids, text.doc_starts, vocab);
  write_file_atomic((tmp / kTokensFile).string(), bin);
  const nlohmann::json j = {{"format", kDatasetFormat},
                            {"version", kDatasetVersion},
                            {"corpus", corpus_name},
                            {"tokenizer", tokenizer.record(has_model ? kTokenizerFile : "")},
                            {"tokens", text.ids.size()},
                            {"documents", text.doc_starts.size()},
                            {"dtype", dtype_name(vocab <= 65536 ? 2 : 4)},
                            {"tokens_file", kTokensFile}};
  write_file_atomic((tmp / kDatasetJson).string(), j.dump(2) + "\n");
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove_all(tmp);
    throw InvalidConfig(fmt::format("prepare-data: cannot rename {} to {}: {}", tmp.string(),
                                    target.string(), ec.message()));
  }
}

DatasetHeader parse_dataset_json(const nlohmann::json& j, const std::string& file) {
  PARM_CONFIG_CHECK(j.is_object(), "prepared dataset {}: not a JSON object", file);
  auto field = [&](const char* key) -> const nlohmann::json& {
    PARM_CONFIG_CHECK(j.contains(key), "prepared dataset {}: missing \"{}\"", file, key);
    return j.at(key);
  };
  PARM_CONFIG_CHECK(field("format") == kDatasetFormat,
                    "prepared dataset {}: \"format\" is {}, expected \"{}\"", file,
                    field("format").dump(), kDatasetFormat);
  PARM_CONFIG_CHECK(field("version") == kDatasetVersion,
                    "prepared dataset {}: version {} is not supported (this build reads version "
                    "{}); prepare it again with parm prepare-data",
                    file, field("version").dump(), kDatasetVersion);
  DatasetHeader h;
  auto count = [&](const char* key) {
    const auto& v = field(key);
    PARM_CONFIG_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                      "prepared dataset {}: \"{}\" must be a whole number >= 0, got {}", file,
                      key, v.dump());
    return v.get<uint64_t>();
  };
  auto text = [&](const char* key) {
    const auto& v = field(key);
    PARM_CONFIG_CHECK(v.is_string(), "prepared dataset {}: \"{}\" must be a string, got {}",
                      file, key, v.dump());
    return v.get<std::string>();
  };
  h.tokens = count("tokens");
  h.documents = count("documents");
  h.corpus = text("corpus");
  const std::string dtype = text("dtype");
  PARM_CONFIG_CHECK(dtype == "uint16" || dtype == "uint32",
                    "prepared dataset {}: dtype \"{}\" is not valid; uint16 or uint32", file,
                    dtype);
  h.width = dtype == "uint16" ? 2 : 4;
  h.tokens_file = text("tokens_file");
  PARM_CONFIG_CHECK(h.tokens_file == kTokensFile,
                    "prepared dataset {}: tokens_file \"{}\" must be \"{}\"", file,
                    h.tokens_file, kTokensFile);
  h.tokenizer = field("tokenizer");
  PARM_CONFIG_CHECK(h.tokenizer.is_object() && h.tokenizer.contains("vocab") &&
                        h.tokenizer.at("vocab").is_number_unsigned() &&
                        h.tokenizer.at("vocab").get<uint64_t>() >= 1 &&
                        h.tokenizer.at("vocab").get<uint64_t>() <= (1ull << 31) - 1,
                    "prepared dataset {}: \"tokenizer\" must be a record with a vocabulary "
                    "size (\"vocab\": 1 to 2^31 - 1), got {}",
                    file, h.tokenizer.dump());
  return h;
}

DatasetHeader read_dataset_header(const std::string& dir) {
  const std::string file = (fs::path(dir) / kDatasetJson).string();
  PARM_CONFIG_CHECK(fs::is_directory(dir),
                    "prepared dataset {} is not a folder (make one with parm prepare-data)", dir);
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  PARM_CONFIG_CHECK(!ec, "prepared dataset {}: cannot read {}: {}", dir, file, ec.message());
  PARM_CONFIG_CHECK(size <= (1u << 20), "prepared dataset {}: {} bytes, more than 1 MiB", file,
                    size);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(file));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidConfig(fmt::format("prepared dataset {}: not valid JSON: {}", file, e.what()));
  } catch (const Error& e) {
    throw InvalidConfig(fmt::format("prepared dataset {}: {}", file, e.what()));
  }
  return parse_dataset_json(j, file);
}

std::unique_ptr<Tokenizer> prepared_tokenizer(const std::string& dir) {
  const DatasetHeader h = read_dataset_header(dir);
  return tokenizer_from_record(h.tokenizer, dir, fmt::format("prepared dataset {}", dir));
}

Corpus open_prepared_corpus(const std::string& dir, double val_fraction, int64_t seq_len) {
  const DatasetHeader h = read_dataset_header(dir);
  const std::string bin = (fs::path(dir) / h.tokens_file).string();
  auto map = std::make_shared<MappedFile>(bin);
  const TokensView v = parse_tokens_file(map->data(), map->size(), bin);
  const auto vocab = h.tokenizer.at("vocab").get<uint64_t>();
  PARM_CONFIG_CHECK(v.tokens == h.tokens && v.documents == h.documents && v.width == h.width &&
                        v.vocab == vocab,
                    "prepared dataset {}: dataset.json ({} tokens, {} documents, {}, vocabulary "
                    "{}) and {} ({} tokens, {} documents, {}, vocabulary {}) disagree",
                    dir, h.tokens, h.documents, dtype_name(h.width), vocab, kTokensFile,
                    v.tokens, v.documents, dtype_name(v.width), v.vocab);
  PARM_CONFIG_CHECK(v.tokens <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                    "prepared dataset {}: {} tokens", dir, v.tokens);
  const auto tokenizer =
      tokenizer_from_record(h.tokenizer, dir, fmt::format("prepared dataset {}", dir));
  Corpus c;
  c.name = fmt::format("prepared:{} ({})", dir, h.corpus);
  split_tokens(c, TokenSpan(v.ids, v.width, static_cast<int64_t>(v.tokens)), val_fraction,
               seq_len);
  c.vocab = static_cast<int32_t>(vocab);
  c.tokenizer = tokenizer->identity();
  c.documents = static_cast<int64_t>(v.documents);
  c.storage = map;
  return c;
}

}  // namespace parm::data
