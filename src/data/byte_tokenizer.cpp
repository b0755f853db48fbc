// The byte tokenizer: token = byte value.
#include "data/batch.h"
#include "data/tokenizer.h"
#include "parm/error.h"

namespace parm::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int32_t vocab_size() const override { return kByteVocab; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      PARM_CONFIG_CHECK(ids[i] >= 0 && ids[i] < kByteVocab,
                        "byte tokenizer: id {} at position {} is outside [0, {})", ids[i], i,
                        kByteVocab);
      text[i] = static_cast<char>(static_cast<uint8_t>(ids[i]));
    }
    return text;
  }
  const std::string& model_bytes() const override {
    static const std::string none;
    return none;
  }
  std::string describe() const override { return "byte (vocabulary 256)"; }
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace parm::data
