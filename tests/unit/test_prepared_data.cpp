// Prepared datasets (data/prepared_dataset.h) against their tokenizer: the same ids in the
// same order and every document boundary; the byte tokenizer's dataset against today's byte
// corpus; and the refusals of bad files, each naming the file and what is wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "data/batches.h"
#include "data/checksum.h"
#include "data/mapped_file.h"
#include "data/prepared_dataset.h"
#include "data/prepared_format.h"
#include "data/sentencepiece_tokenizer.h"
#include "parm/error.h"
#include "parm/fileio.h"

namespace parm::data {
namespace {

namespace fs = std::filesystem;

class Scratch {
 public:
  Scratch() {
    std::string t = (fs::temp_directory_path() / "parm-prepared-XXXXXX").string();
    path_ = ::mkdtemp(t.data()) != nullptr ? t : "";
  }
  ~Scratch() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string synthetic_text() {
  const char* words[] = {"In",   "the",   "beginning", "God", "created", "heaven", "and",
                         "earth", "light", "darkness", "day", "night",   "  ",     "\t"};
  std::string text;
  uint64_t s = 7;
  for (int line = 0; line < 400; ++line) {
    const int n = 1 + static_cast<int>(line % 9);
    for (int w = 0; w < n; ++w) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      text += std::string(w ? " " : "") + words[(s >> 33) % 14];
    }
    text += line % 50 == 7 ? "\xc3\xa9\xe2\x82\xac.\n" : ".\n";  // a few characters beyond ASCII
  }
  return text;
}

std::unique_ptr<Tokenizer> small_bpe(const std::string& text) {
  std::vector<std::string_view> sentences;
  for (auto d : split_documents(text)) sentences.push_back(d.substr(0, d.size() - 1));
  SentencePieceOptions o;
  o.vocab = 320;
  return sentencepiece_tokenizer(train_sentencepiece(sentences, o), "small bpe");
}

std::string slurp(const std::string& p) { return read_file(p); }
void spit(const std::string& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// The message of the InvalidConfig that `f` throws ("" when it throws none).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  return "";
}

TEST(PreparedData, SentencePieceRoundTripsAndIsDeterministic) {
  const std::string text = synthetic_text();
  const auto t = small_bpe(text);
  EXPECT_EQ(t->vocab_size(), 320);
  const auto ids = t->encode(text);
  EXPECT_LT(ids.size(), text.size());  // it learnt pieces longer than a byte
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(small_bpe(text)->checksum(), t->checksum());
  const std::vector<int32_t> bad = {1, 320};
  EXPECT_THROW(t->decode(bad), InvalidConfig);
}

TEST(PreparedData, ReaderGivesTheTokenizersIdsAndEveryDocumentBoundary) {
  Scratch dir;
  const std::string text = synthetic_text();
  const auto t = small_bpe(text);
  spit(dir / "corpus.txt", text);
  write_file_atomic(dir / "tok.model", t->model_bytes());
  const auto loaded = load_tokenizer(dir / "tok.model");
  EXPECT_EQ(loaded->identity(), t->identity());
  write_prepared(dir / "ds", *loaded, "file:corpus.txt", encode_documents(*loaded, text, true));

  // What the tokenizer gives, document by document.
  std::vector<int32_t> want;
  std::vector<uint64_t> starts;
  for (std::string_view doc : split_documents(text)) {
    starts.push_back(want.size());
    const auto ids = t->encode(doc);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  ASSERT_EQ(starts.size(), 400u);
  const MappedFile map(dir / "ds/tokens.bin");
  const TokensView v = parse_tokens_file(map.data(), map.size(), "tokens.bin");
  ASSERT_EQ(v.tokens, want.size());
  ASSERT_EQ(v.documents, starts.size());
  EXPECT_EQ(v.width, 2u);
  for (uint64_t d = 0; d < v.documents; ++d) EXPECT_EQ(v.document_start(d), starts[d]) << d;
  EXPECT_EQ(v.document_start(v.documents), want.size());

  const Corpus c = open_prepared_corpus(dir / "ds", 0.05, 16);
  EXPECT_EQ(c.vocab, 320);
  EXPECT_EQ(c.documents, 400);
  EXPECT_EQ(c.tokenizer, t->identity());
  ASSERT_EQ(c.train.size() + c.val.size(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(c.val.size(), static_cast<int64_t>(static_cast<double>(want.size()) * 0.05));
  for (int64_t i = 0; i < c.train.size(); ++i) ASSERT_EQ(c.train[i], want[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < c.val.size(); ++i)
    ASSERT_EQ(c.val[i], want[static_cast<size_t>(c.train.size() + i)]);
  EXPECT_EQ(prepared_tokenizer(dir / "ds")->identity(), t->identity());
  // A second preparation into the same folder is refused, the first left as it was.
  EXPECT_NE(refusal([&] { write_prepared(dir / "ds", *t, "x", EncodedText{}); }).find("exists"),
            std::string::npos);
}

TEST(PreparedData, ByteDatasetBatchesEqualTheInMemoryByteCorpus) {
  Scratch dir;
  const std::string text = synthetic_text();
  spit(dir / "corpus.txt", text);
  const auto bytes = byte_tokenizer();
  write_prepared(dir / "ds", *bytes, "file", encode_documents(*bytes, text, true));
  const Corpus mapped = open_prepared_corpus(dir / "ds", 0.05, 32);
  const Corpus memory = load_corpus("file:" + (dir / "corpus.txt"), 0.05, 32);
  ASSERT_EQ(mapped.train.size(), memory.train.size());
  for (Objective o : {Objective::kCausal, Objective::kMasked}) {
    const BatchSource a(mapped, o, 32, 5), b(memory, o, 32, 5);
    for (int64_t first : {0, 9, 1000}) {
      EXPECT_EQ(a.train_batch(first, 3).tokens, b.train_batch(first, 3).tokens);
      EXPECT_EQ(a.train_batch(first, 3).targets, b.train_batch(first, 3).targets);
    }
    EXPECT_EQ(a.val_batch(1, 2).tokens, b.val_batch(1, 2).tokens);
  }
}

TEST(PreparedData, DataPositionsThatWouldOverflowAreRefused) {
  std::vector<int32_t> ids(4000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 256);
  const Corpus c = corpus_of_ids("ids", ids, 256, nullptr, 0.1, 8);
  const BatchSource s(c, Objective::kCausal, 8, 1);
  s.check_position(0, 1000, "x");
  s.check_position(std::numeric_limits<int64_t>::max() - 16, 16, "x");
  const std::string m = refusal(
      [&] { s.check_position(std::numeric_limits<int64_t>::max() - 7, 16, "checkpoint ck"); });
  EXPECT_NE(m.find("checkpoint ck: data position 9223372036854775800 cannot be reached"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("valid data positions for this run: 0 to 9223372036854775791"),
            std::string::npos)
      << m;
  EXPECT_NE(refusal([&] { s.check_position(-1, 0, "ck"); }), "");
}

class BadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    text_ = synthetic_text();
    tok_ = small_bpe(text_);
    write_prepared(dir_ / "ds", *tok_, "synthetic", encode_documents(*tok_, text_, false));
    bin_ = slurp(dir_ / "ds/tokens.bin");
  }
  // Opens the dataset with tokens.bin replaced by `bin` (resealed: checksums recomputed).
  std::string open_with(std::string bin, bool reseal = true) {
    if (reseal && bin.size() >= kTokensHeaderBytes) {
      uint32_t w;
      uint64_t n, d;
      std::memcpy(&w, bin.data() + 12, 4);
      std::memcpy(&n, bin.data() + 24, 8);
      std::memcpy(&d, bin.data() + 32, 8);
      const uint64_t at = (kTokensHeaderBytes + n * w + 7) / 8 * 8;
      if ((w == 2 || w == 4) && at + 8 * (d + 1) == bin.size()) {
        const uint64_t h1 = fnv1a64(bin.data() + kTokensHeaderBytes, n * w);
        const uint64_t h2 = fnv1a64(bin.data() + at, 8 * (d + 1));
        std::memcpy(bin.data() + 40, &h1, 8);
        std::memcpy(bin.data() + 48, &h2, 8);
      }
      const uint64_t h0 = fnv1a64(bin.data(), 56);
      std::memcpy(bin.data() + 56, &h0, 8);
    }
    spit(dir_ / "ds/tokens.bin", bin);
    return refusal([&] { open_prepared_corpus(dir_ / "ds", 0.05, 16); });
  }
  static void expect_has(const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
  Scratch dir_;
  std::string text_, bin_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(BadFiles, GoodFileOpens) { EXPECT_EQ(open_with(bin_), ""); }

TEST_F(BadFiles, Truncated) {
  for (size_t keep : {size_t{0}, size_t{10}, size_t{63}, bin_.size() / 2, bin_.size() - 1}) {
    const std::string m = open_with(bin_.substr(0, keep), false);
    expect_has(m, "tokens.bin");
    expect_has(m, "truncated");
  }
}

TEST_F(BadFiles, WrongMagicOrVersion) {
  std::string b = bin_;
  b[0] = 'X';
  std::string m = open_with(b);
  expect_has(m, "tokens.bin");
  expect_has(m, "wrong magic");
  b = bin_;
  const uint32_t v2 = 2;
  std::memcpy(b.data() + 8, &v2, 4);
  m = open_with(b);
  expect_has(m, "version 2 is not supported");
}

TEST_F(BadFiles, IdOutsideTheVocabulary) {
  std::string b = bin_;
  const uint16_t big = 320;  // == the vocabulary
  std::memcpy(b.data() + kTokensHeaderBytes + 2 * 5, &big, 2);
  const std::string m = open_with(b);
  expect_has(m, "tokens.bin");
  expect_has(m, "token 5 is id 320, outside the vocabulary [0, 320)");
}

TEST_F(BadFiles, CorruptIdsOrIndex) {
  std::string b = bin_;
  b[kTokensHeaderBytes + 3] ^= 1;
  expect_has(open_with(b, false), "checksum mismatch in the token ids");
  b = bin_;
  b[b.size() - 3] ^= 1;
  expect_has(open_with(b, false), "checksum mismatch in the document index");
  b = bin_;
  uint64_t first = 5;  // the index must start at 0
  std::memcpy(b.data() + b.size() - 8 * 401, &first, 8);
  expect_has(open_with(b), "document index must start at 0");
}

TEST_F(BadFiles, DatasetJsonAndTokenizer) {
  const std::string json = slurp(dir_ / "ds/dataset.json");
  auto j = nlohmann::json::parse(json);
  j["tokens"] = j["tokens"].get<uint64_t>() + 1;
  spit(dir_ / "ds/dataset.json", j.dump());
  expect_has(open_with(bin_), "disagree");
  j = nlohmann::json::parse(json);
  j["version"] = 7;
  spit(dir_ / "ds/dataset.json", j.dump());
  expect_has(open_with(bin_), "version 7 is not supported");
  spit(dir_ / "ds/dataset.json", json);
  std::string model = slurp(dir_ / "ds/tokenizer.model");
  model[model.size() / 2] ^= 4;
  spit(dir_ / "ds/tokenizer.model", model);
  const std::string m = open_with(bin_);
  expect_has(m, "prepared dataset");
  expect_has(m, "fnv1a64");
}

}  // namespace
}  // namespace parm::data
