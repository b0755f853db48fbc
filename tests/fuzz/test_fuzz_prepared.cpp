// The prepared-dataset reader (data/prepared_dataset.h, data/prepared_format.h) against 2,400
// mutated datasets made from valid ones (a byte and a SentencePiece dataset): byte damage to
// tokens.bin with and without its checksums recomputed afterwards (so that the structural
// checks behind them are reached: sizes, widths, the index, ids >= the vocabulary), and
// structural damage to dataset.json. Each is refused with InvalidConfig or opens a dataset
// whose every id is inside its vocabulary. And SentencePiece .model files (load_tokenizer),
// 2,400 byte-level mutations.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/checksum.h"
#include "data/prepared_dataset.h"
#include "data/prepared_format.h"
#include "data/sentencepiece_tokenizer.h"
#include "fuzz_util.h"
#include "parm/fileio.h"

namespace parm {
namespace {

namespace fs = std::filesystem;
constexpr int kCases = 2400;

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
T get(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}
template <typename T>
void put(std::string& s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof(T));
}

// Recomputes the checksums of a damaged tokens.bin where its header still describes its
// size, so that the reader's later checks see the damage.
void reseal(std::string& s) {
  if (s.size() < data::kTokensHeaderBytes) return;
  const auto width = get<uint32_t>(s, 12);
  const auto n = get<uint64_t>(s, 24), d = get<uint64_t>(s, 32);
  const uint64_t room = s.size() - data::kTokensHeaderBytes;
  if ((width == 2 || width == 4) && n <= room / width && d < room / 8) {
    const uint64_t index_at = (data::kTokensHeaderBytes + n * width + 7) / 8 * 8;
    if (index_at + 8 * (d + 1) == s.size()) {
      put(s, 40, data::fnv1a64(s.data() + data::kTokensHeaderBytes, n * width));
      put(s, 48, data::fnv1a64(s.data() + index_at, 8 * (d + 1)));
    }
  }
  put(s, 56, data::fnv1a64(s.data(), 56));
}

// Targeted damage to the header's fields (then resealed): what random bytes rarely reach.
std::string damage_header(fuzz::Rng& rng, std::string& s) {
  switch (rng.below(6)) {
    case 0: put<uint32_t>(s, 8, 2); return "version 2";
    case 1: put<uint32_t>(s, 12, static_cast<uint32_t>(rng.below(6))); return "width";
    case 2: put<uint32_t>(s, 16, static_cast<uint32_t>(rng.below(300))); return "vocab";
    case 3: put<uint64_t>(s, 24, get<uint64_t>(s, 24) + rng.below(5) - 2); return "tokens";
    case 4: put<uint64_t>(s, 32, rng.chance(50) ? ~0ull : get<uint64_t>(s, 32) + 1); return "docs";
    default: {  // an id past the vocabulary
      const auto width = get<uint32_t>(s, 12);
      const auto n = get<uint64_t>(s, 24);
      if (n == 0) return "none";
      const size_t at = data::kTokensHeaderBytes + width * rng.below(n);
      if (width == 2) put<uint16_t>(s, at, static_cast<uint16_t>(get<uint32_t>(s, 16)));
      else put<uint32_t>(s, at, get<uint32_t>(s, 16));
      return "id = vocab";
    }
  }
}

TEST(FuzzReaders, PreparedDatasetsAreRefusedOrValid) {
  fuzz::TempDir dir;
  std::string text;
  const char* words[] = {"the", "lord", "said", "unto", "moses", "and", "his", "people", "ze"};
  fuzz::Rng wr(3);
  for (int line = 0; line < 200; ++line) {
    for (int w = 0; w < 6; ++w) text += std::string(w ? " " : "") + words[wr.below(9)];
    text += "\n";
  }
  std::vector<std::string_view> sentences;
  for (auto d : data::split_documents(text)) sentences.push_back(d.substr(0, d.size() - 1));
  data::SentencePieceOptions o;
  o.vocab = 300;
  const auto sp = data::sentencepiece_tokenizer(data::train_sentencepiece(sentences, o), "sp");
  const auto bytes = data::byte_tokenizer();
  std::vector<std::string> bases;
  for (const data::Tokenizer* t : {bytes.get(), sp.get()}) {
    const std::string base = dir.path() + "/base-" + t->kind();
    data::write_prepared(base, *t, "synthetic", data::encode_documents(*t, text, false));
    bases.push_back(base);
  }
  const std::string work = dir.path() + "/work";
  fuzz::Rng rng(17);
  int accepted = 0, refused = 0, other = 0;
  for (int c = 0; c < kCases; ++c) {
    const std::string& base = bases[rng.below(bases.size())];
    fs::remove_all(work);
    fs::copy(base, work);
    std::string what = fmt::format("case {} ({}):", c, base);
    if (rng.chance(60)) {
      std::string bin = read_file(work + "/tokens.bin");
      const size_t kind = rng.below(3);
      if (kind == 0) what += " tokens.bin header " + damage_header(rng, bin);
      else what += " tokens.bin " + fuzz::mutate_bytes(rng, bin);
      if (kind != 2) reseal(bin);
      write(work + "/tokens.bin", bin);
    } else {
      nlohmann::json j = nlohmann::json::parse(read_file(work + "/dataset.json"));
      for (size_t n = 1 + rng.below(2); n > 0; --n) what += " " + fuzz::mutate_json(rng, j);
      write(work + "/dataset.json", j.dump(2));
    }
    if (fuzz::accepted_or_refused(
            [&] {
              const data::Corpus corpus = data::open_prepared_corpus(work, 0.1, 8);
              for (const data::TokenSpan* s : {&corpus.train, &corpus.val})
                for (int64_t i = 0; i < s->size(); ++i)
                  ASSERT_LT((*s)[i], corpus.vocab) << what;
            },
            what, other))
      ++accepted;
    else
      ++refused;
  }
  fuzz::expect_outcomes("prepared dataset", kCases, accepted, refused, other);
}

// A user's .model file goes straight to SentencePiece's parser (load_tokenizer): mutated
// models are refused with InvalidConfig or load a tokenizer that encodes and decodes.
TEST(FuzzReaders, TokenizerModelsAreRefusedOrWork) {
  std::string text;
  const char* words[] = {"in", "the", "beginning", "was", "the", "word", "and", "light"};
  fuzz::Rng wr(5);
  for (int line = 0; line < 200; ++line) {
    for (int w = 0; w < 5; ++w) text += std::string(w ? " " : "") + words[wr.below(8)];
    text += "\n";
  }
  std::vector<std::string_view> sentences;
  for (auto d : data::split_documents(text)) sentences.push_back(d.substr(0, d.size() - 1));
  data::SentencePieceOptions o;
  o.vocab = 290;
  const std::string model = data::train_sentencepiece(sentences, o);
  constexpr int kModelCases = 2400;
  fuzz::Rng rng(23);
  int accepted = 0, refused = 0, other = 0;
  for (int c = 0; c < kModelCases; ++c) {
    std::string b = model;
    std::string what = fmt::format("model case {}:", c);
    for (size_t n = 1 + rng.below(2); n > 0; --n) what += " " + fuzz::mutate_bytes(rng, b);
    if (fuzz::accepted_or_refused(
            [&] {
              const auto t = data::sentencepiece_tokenizer(b, "fuzzed.model");
              const auto ids = t->encode("in the beginning was the word\n");
              for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size()) << what;
              t->decode(ids);
            },
            what, other))
      ++accepted;
    else
      ++refused;
  }
  fuzz::expect_outcomes("tokenizer model", kModelCases, accepted, refused, other);
}

}  // namespace
}  // namespace parm
