#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "data/checksum.h"
#include "parm/error.h"

namespace parm::data {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string bytes, const std::string& origin)
      : bytes_(std::move(bytes)) {
    const auto st = sp_.LoadFromSerializedProto(bytes_);
    PARM_CONFIG_CHECK(st.ok() && sp_.GetPieceSize() > 0,
                      "tokenizer {} is not a SentencePiece model ({} bytes): {}", origin,
                      bytes_.size(), st.ok() ? "no pieces" : st.ToString());
    vocab_ = sp_.GetPieceSize();
  }
  std::string kind() const override { return "sentencepiece"; }
  int32_t vocab_size() const override { return vocab_; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    PARM_CHECK(st.ok(), "sentencepiece encode of {} bytes: {}", text.size(), st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(std::span<const int32_t> ids) const override {
    for (size_t i = 0; i < ids.size(); ++i)
      PARM_CONFIG_CHECK(ids[i] >= 0 && ids[i] < vocab_,
                        "sentencepiece tokenizer: id {} at position {} is outside [0, {})",
                        ids[i], i, vocab_);
    const std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    const auto st = sp_.Decode(v, &text);
    PARM_CHECK(st.ok(), "sentencepiece decode of {} ids: {}", ids.size(), st.ToString());
    return text;
  }
  const std::string& model_bytes() const override { return bytes_; }
  std::string describe() const override {
    return fmt::format("sentencepiece, vocabulary {} (fnv1a64 {})", vocab_, checksum());
  }

 private:
  std::string bytes_;
  sentencepiece::SentencePieceProcessor sp_;
  int32_t vocab_ = 0;
};

class Sentences final : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<std::string_view>& s) : s_(s) { load(); }
  bool done() const override { return i_ >= s_.size(); }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return cur_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (i_ < s_.size()) cur_.assign(s_[i_]);
  }
  const std::vector<std::string_view>& s_;
  size_t i_ = 0;
  std::string cur_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(std::string model_bytes,
                                                   const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(std::move(model_bytes), origin);
}

std::string train_sentencepiece(const std::vector<std::string_view>& sentences,
                                const SentencePieceOptions& o) {
  PARM_CONFIG_CHECK(o.model_type == "bpe" || o.model_type == "unigram",
                    "sentencepiece model type '{}' is not valid; use bpe or unigram",
                    o.model_type);
  // <unk>, the 256 byte pieces and at least one learnt piece.
  PARM_CONFIG_CHECK(o.vocab >= 258 && o.vocab <= (1 << 24),
                    "tokenizer vocabulary {} must be in [258, 16777216] (<unk>, the 256 byte "
                    "pieces and the learnt ones)",
                    o.vocab);
  PARM_CONFIG_CHECK(!sentences.empty(), "the tokenizer's training corpus is empty");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"input_sentence_size", "0"},        // every sentence: no sampling
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", "65536"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"minloglevel", "2"},
      {"model_prefix", ""}};
  Sentences it(sentences);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  PARM_CONFIG_CHECK(st.ok(), "sentencepiece {} training (vocabulary {}) failed: {}",
                    o.model_type, o.vocab, st.ToString());
  return model;
}

}  // namespace parm::data
