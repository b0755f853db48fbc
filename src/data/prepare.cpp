#include "data/prepare.h"

#include <filesystem>

#include "data/checksum.h"
#include "data/corpus.h"
#include "data/prepared_dataset.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"

namespace parm::data {
namespace {

namespace fs = std::filesystem;

// Documents without their line ends: what the tokenizer learns from.
std::vector<std::string_view> sentences_of(std::string_view text) {
  std::vector<std::string_view> s;
  for (std::string_view d : split_documents(text)) {
    if (!d.empty() && d.back() == '\n') d.remove_suffix(1);
    if (!d.empty()) s.push_back(d);
  }
  return s;
}

}  // namespace

std::unique_ptr<Tokenizer> train_tokenizer(const std::string& corpus,
                                           const SentencePieceOptions& options,
                                           const std::string& out) {
  const std::string text = read_corpus_text(corpus);
  std::string model = train_sentencepiece(sentences_of(text), options);
  auto t = sentencepiece_tokenizer(model, out);
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_file_atomic(out, model);
  return t;
}

PrepareSummary prepare_dataset(const Tokenizer& tokenizer, const std::string& corpus,
                               const std::string& out) {
  PARM_CONFIG_CHECK(!fs::exists(out),
                    "prepare-data: {} exists; remove it or name another --out folder", out);
  const std::string text = read_corpus_text(corpus);
  const EncodedText enc = encode_documents(tokenizer, text, true);
  const fs::path parent = fs::path(out).lexically_normal().parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_prepared(out, tokenizer, corpus, enc);
  PrepareSummary s;
  s.text_bytes = static_cast<int64_t>(text.size());
  s.tokens = static_cast<int64_t>(enc.ids.size());
  s.documents = static_cast<int64_t>(enc.doc_starts.size());
  s.not_round_trip = enc.not_round_trip;
  return s;
}

CacheEntry cache_entry(const std::string& root, const std::string& corpus,
                       const std::string& tokenizer, int32_t vocab,
                       const std::string& tokenizer_file) {
  const std::string text = read_corpus_text(corpus);
  const std::string key = hex64(fnv1a64(text.data(), text.size()));
  CacheEntry e;
  if (tokenizer_file.empty()) {
    e.folder = (fs::path(root) / fmt::format("{}-{}{}", key, tokenizer, vocab)).string();
    e.tokenizer_file = (fs::path(e.folder) / "tokenizer.model").string();
  } else {
    const std::string bytes = read_file(tokenizer_file);
    e.folder = (fs::path(root) /
                fmt::format("{}-sp-{}", key, hex64(fnv1a64(bytes.data(), bytes.size()))))
                   .string();
    e.tokenizer_file = tokenizer_file;
  }
  e.prepared = (fs::path(e.folder) / "prepared").string();
  return e;
}

std::string build_cache_entry(const CacheEntry& e, const std::string& corpus,
                              const std::string& kind, int32_t vocab) {
  std::string said;
  if (!fs::exists(e.tokenizer_file)) {
    const double t0 = now_us();
    SentencePieceOptions o;
    o.model_type = kind;
    o.vocab = vocab;
    train_tokenizer(corpus, o, e.tokenizer_file);
    said += fmt::format("data cache: trained a {} tokenizer of {} pieces on {} into {} "
                        "({:.1f} s)\n",
                        kind, vocab, corpus, e.tokenizer_file, (now_us() - t0) / 1e6);
  }
  if (!fs::exists(e.prepared)) {
    const double t0 = now_us();
    const auto tok = load_tokenizer(e.tokenizer_file);
    const PrepareSummary s = prepare_dataset(*tok, corpus, e.prepared);
    said += fmt::format("data cache: prepared {} with {} into {}: {} tokens, {} documents "
                        "({:.1f} s)\n",
                        corpus, e.tokenizer_file, e.prepared, s.tokens, s.documents,
                        (now_us() - t0) / 1e6);
  }
  return said;
}

}  // namespace parm::data
