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
  // BERT's [MASK]: the id after the tokenizer's last (256 for bytes).
  virtual int32_t mask_id() const = 0;
};

// The tokenizer a checkpoint's model was trained with, from its manifest (its "tokenizer"
// record: {"kind": K, "vocab": V, ...}, absent for byte-level tokens) and its folder (where a
// tokenizer's model file is kept): bytes (data/batch.h), or the tokenizer the record names
// (data/tokenizer.h, its model file kept in the checkpoint). Throws InvalidConfig naming a
// record that cannot be read back.
std::unique_ptr<TextCodec> make_text_codec(const nlohmann::json& manifest,
                                           const std::string& checkpoint_folder);

}  // namespace parm::cli
