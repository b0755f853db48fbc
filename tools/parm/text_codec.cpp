#include "text_codec.h"

#include "data/batch.h"
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
};

}  // namespace

std::unique_ptr<TextCodec> make_text_codec(const nlohmann::json& manifest,
                                           const std::string& checkpoint_folder) {
  const bool bytes = !manifest.contains("tokenizer") || manifest.at("tokenizer").is_null() ||
                     (manifest.at("tokenizer").is_object() &&
                      manifest.at("tokenizer").value("kind", "") == "byte");
  if (bytes) return std::make_unique<ByteCodec>();
  throw InvalidConfig(fmt::format(
      "checkpoint {}: its tokenizer is {}, which `parm generate` in this build does not read; "
      "valid: byte-level tokens (no \"tokenizer\" record, or kind \"byte\")",
      checkpoint_folder, manifest.at("tokenizer").dump()));
}

}  // namespace parm::cli
