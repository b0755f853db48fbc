// Text <-> token ids for `parm generate`: the one place the command meets a tokenizer, so that
// another tokenizer plugs in by adding a TextCodec and a case of make_text_codec.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace parm::cli {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // The ids of `text` (each in [0, vocabulary)).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // The text of `ids`; an id with no text of its own (BERT's [MASK]) is shown as "[MASK]".
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::string name() const = 0;
};

// The tokenizer a checkpoint's model was trained with, from its manifest's model_config and
// its folder. Today every model reads bytes (data/batch.h): a config without a "tokenizer"
// key. Throws InvalidConfig naming a tokenizer this build does not know.
std::unique_ptr<TextCodec> make_text_codec(const nlohmann::json& model_config,
                                           const std::string& checkpoint_folder);

}  // namespace parm::cli
