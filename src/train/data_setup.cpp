#include "train/data_setup.h"

#include <cstdio>
#include <filesystem>

#include "data/prepare.h"
#include "data/prepared_dataset.h"
#include "parm/error.h"

namespace parm::train {
namespace {

namespace fs = std::filesystem;

bool is_byte(const DataConfig& d) { return d.tokenizer.empty() || d.tokenizer == "byte"; }
bool is_kind(const DataConfig& d) { return d.tokenizer_vocab > 0; }

std::string cache_root(const DataConfig& d) {
  if (!d.cache.empty()) return d.cache;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ((ec ? fs::current_path() : exe.parent_path()) / "data-cache").string();
}

// The cache entry of a run that reads from the cache (no data.prepared, not bytes).
data::CacheEntry entry_of(const DataConfig& d) {
  return is_kind(d) ? data::cache_entry(cache_root(d), d.corpus, d.tokenizer, d.tokenizer_vocab, "")
                    : data::cache_entry(cache_root(d), d.corpus, "", 0, d.tokenizer);
}

// Every rank sees the same `error` ("" = none): rank 0's is broadcast.
void agree_on(Communicator& world, std::string& error) {
  std::vector<char> buf(4096, '\0');
  if (world.rank() == 0) error.copy(buf.data(), buf.size() - 1);
  world.broadcast(buf.data(), buf.size(), DType::kU8, 0);
  error = buf.data();
}

}  // namespace

int32_t tokenizer_vocab(const DataConfig& d) {
  PARM_CONFIG_CHECK(is_kind(d) || (d.tokenizer != "bpe" && d.tokenizer != "unigram"),
                    "data.tokenizer \"{}\" needs a vocabulary: write {{\"kind\": \"{}\", "
                    "\"vocab\": 8192}} (or --tokenizer FILE.model)",
                    d.tokenizer, d.tokenizer);
  if (!d.prepared.empty())
    return static_cast<int32_t>(
        data::read_dataset_header(d.prepared).tokenizer.at("vocab").get<uint64_t>());
  if (is_byte(d)) return data::byte_tokenizer()->vocab_size();
  if (is_kind(d)) return d.tokenizer_vocab;
  return data::load_tokenizer(d.tokenizer)->vocab_size();
}

void apply_tokenizer_vocab(TrainConfig& c) {
  const DataConfig& d = c.data;
  PARM_CONFIG_CHECK(!(is_kind(d) && !d.prepared.empty()),
                    "data.tokenizer {{\"kind\": \"{}\", \"vocab\": {}}} trains a tokenizer into "
                    "the cache, but data.prepared ({}) already holds tokenized data: name its "
                    "tokenizer file (or none) instead",
                    d.tokenizer, d.tokenizer_vocab, d.prepared);
  const int32_t v = tokenizer_vocab(d);
  const int64_t vocab = v + (c.model.arch == model::Arch::kBert ? 1 : 0);
  if (is_byte(d) && d.prepared.empty()) {
    if (!d.vocab_in_config) c.model.vocab = vocab;
    return;
  }
  PARM_CONFIG_CHECK(!d.vocab_in_config || c.model.vocab == vocab,
                    "model.vocab {} is not the tokenizer's: {} has {} ids{}; leave model.vocab "
                    "out (it comes from the tokenizer)",
                    c.model.vocab, d.prepared.empty() ? d.tokenizer : d.prepared, v,
                    c.model.arch == model::Arch::kBert ? " (+1 for [MASK])" : "");
  c.model.vocab = vocab;
}

TrainingData open_training_data(const TrainConfig& c, Communicator& world, bool verbose) {
  const DataConfig& d = c.data;
  const int64_t seq_len = c.model.seq_len;
  if (is_byte(d) && d.prepared.empty())
    return {data::load_corpus(d.corpus, d.val_fraction, seq_len), data::byte_tokenizer()};
  std::string prepared = d.prepared, error;
  if (prepared.empty()) {
    // Rank 0 makes what is missing; the others wait for its word.
    data::CacheEntry e;
    try {
      e = entry_of(d);
      if (world.rank() == 0) {
        const std::string said =
            data::build_cache_entry(e, d.corpus, d.tokenizer, d.tokenizer_vocab);
        if (verbose) {
          std::fputs(said.empty() ? fmt::format("data cache: using {}\n", e.folder).c_str()
                                  : said.c_str(),
                     stdout);
          std::fflush(stdout);
        }
      }
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    agree_on(world, error);
    PARM_CONFIG_CHECK(error.empty(), "{}", error);
    prepared = e.prepared;
  }
  data::Corpus corpus = data::open_prepared_corpus(prepared, d.val_fraction, seq_len);
  std::shared_ptr<const data::Tokenizer> tokenizer = data::prepared_tokenizer(prepared);
  if (!is_byte(d) && !is_kind(d)) {
    const auto named = data::load_tokenizer(d.tokenizer);
    data::check_same_tokenizer(named->identity(), fmt::format("--tokenizer {}", d.tokenizer),
                               tokenizer->identity(),
                               fmt::format("the prepared dataset {}", prepared));
  } else if (d.tokenizer == "byte") {
    data::check_same_tokenizer(data::byte_tokenizer()->identity(), "--tokenizer byte",
                               tokenizer->identity(),
                               fmt::format("the prepared dataset {}", prepared));
  }
  return {std::move(corpus), std::move(tokenizer)};
}

}  // namespace parm::train
