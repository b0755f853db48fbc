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

// The tokenizer a checkpoint's model was trained with, from its manifest (its "tokenizer"
// record: {"kind": K, "vocab": V, ...}, absent for byte-level tokens) and its folder (where a
// tokenizer's model file is kept). Byte-level tokens (data/batch.h) are the only kind this
// build reads; throws InvalidConfig naming any other.
std::unique_ptr<TextCodec> make_text_codec(const nlohmann::json& manifest,
                                           const std::string& checkpoint_folder);

}  // namespace parm::cli
