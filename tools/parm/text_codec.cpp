#include "text_codec.h"

#include "data/batch.h"
#include "data/tokenizer.h"
#include "parm/error.h"

namespace parm::cli {
namespace {

// Byte-level tokens: id b is the byte b (data/batch.h); BERT's [MASK] is id 256.
class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char ch : text) ids.push_back(ch);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id >= 0 && id < 256)
        text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      else if (id == data::kBertMaskToken)
        text += "[MASK]";
      else
        throw Error(fmt::format("token id {} has no byte", id));
    }
    return text;
  }
  std::string name() const override { return "byte"; }
  int32_t mask_id() const override { return data::kBertMaskToken; }
};

// A tokenizer of data/tokenizer.h (SentencePiece); BERT's [MASK] is the id after its last.
class TokenizerCodec final : public TextCodec {
 public:
  explicit TokenizerCodec(std::unique_ptr<data::Tokenizer> t) : t_(std::move(t)) {}
  std::vector<int32_t> encode(const std::string& text) const override { return t_->encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    std::vector<int32_t> run;  // decoded together: a piece's text depends on its neighbours
    for (int32_t id : ids) {
      if (id != mask_id()) {
        run.push_back(id);
        continue;
      }
      text += t_->decode(run) + "[MASK]";
      run.clear();
    }
    return text + t_->decode(run);
  }
  std::string name() const override { return t_->describe(); }
  int32_t mask_id() const override { return t_->vocab_size(); }

 private:
  std::unique_ptr<data::Tokenizer> t_;
};

}  // namespace

std::unique_ptr<TextCodec> make_text_codec(const nlohmann::json& manifest,
                                           const std::string& checkpoint_folder) {
  const bool bytes = !manifest.contains("tokenizer") || manifest.at("tokenizer").is_null() ||
                     (manifest.at("tokenizer").is_object() &&
                      manifest.at("tokenizer").value("kind", "") == "byte");
  if (bytes) return std::make_unique<ByteCodec>();
  return std::make_unique<TokenizerCodec>(data::tokenizer_from_record(
      manifest.at("tokenizer"), checkpoint_folder, "checkpoint " + checkpoint_folder));
}

}  // namespace parm::cli
