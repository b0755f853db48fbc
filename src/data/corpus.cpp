#include "data/corpus.h"

#include <cstdio>
#include <cstring>

#include "data/tokenizer.h"
#include "parm/error.h"
#include "parm/fileio.h"

namespace parm::data {
namespace {

// The whole King James text, one verse a line, without the "Ge1:1 " references.
std::string read_kjv() {
  FILE* p = ::popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
  std::string raw;
  if (p != nullptr) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) raw.append(buf, n);
    ::pclose(p);
  }
  PARM_CONFIG_CHECK(raw.size() > 1000000,
                    "corpus 'kjv' needs the `bible` command of Debian's bible-kjv package "
                    "(got {} bytes); install it with scripts/install-deps or apt-get install "
                    "bible-kjv, or use \"corpus\": \"file:PATH\"",
                    raw.size());
  std::string text;
  text.reserve(raw.size());
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t end = raw.find('\n', pos);
    if (end == std::string::npos) end = raw.size();
    size_t start = raw.find(' ', pos);  // skip the reference
    start = (start == std::string::npos || start > end) ? pos : start + 1;
    text.append(raw, start, end - start);
    text.push_back('\n');
    pos = end + 1;
  }
  return text;
}

}  // namespace

int32_t TokenSpan::operator[](int64_t i) const {
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, ids_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, ids_ + 4 * i, 4);
  return static_cast<int32_t>(v);
}

void TokenSpan::copy_to(int64_t first, int64_t count, int32_t* out) const {
  PARM_CHECK(first >= 0 && count >= 0 && count <= count_ && first <= count_ - count,
             "tokens [{}, {} + {}) of {}", first, first, count, count_);
  const uint8_t* p = ids_ + static_cast<size_t>(first) * width_;
  if (width_ == 2) {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = static_cast<int32_t>(v);
    }
  }
}

TokenSpan TokenSpan::sub(int64_t first, int64_t count) const {
  PARM_CHECK(first >= 0 && count >= 0 && first + count <= count_, "tokens [{}, {} + {}) of {}",
             first, first, count, count_);
  return TokenSpan(ids_ + static_cast<size_t>(first) * width_, width_, count);
}

std::string read_corpus_text(const std::string& source) {
  if (source == "kjv") return read_kjv();
  if (source.rfind("file:", 0) == 0) {
    try {
      return read_file(source.substr(5));
    } catch (const Error& e) {
      throw InvalidConfig(fmt::format("corpus {}: {}", source, e.what()));
    }
  }
  throw InvalidConfig(fmt::format(
      "unknown corpus '{}'; valid: \"kjv\" (Debian's bible-kjv) or \"file:PATH\"", source));
}

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string_view::npos ? text.size() : end + 1;
    docs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return docs;
}

void split_tokens(Corpus& c, const TokenSpan& all, double val_fraction, int64_t seq_len) {
  PARM_CONFIG_CHECK(val_fraction > 0 && val_fraction < 0.5,
                    "data.val_fraction {} must be in (0, 0.5)", val_fraction);
  const int64_t n = all.size();
  const auto val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  PARM_CONFIG_CHECK(val > seq_len + 1 && n - val > seq_len + 1,
                    "corpus {} ({} tokens) is too short for sequences of {} tokens with "
                    "val_fraction {}",
                    c.name, n, seq_len, val_fraction);
  c.train = all.sub(0, n - val);
  c.val = all.sub(n - val, val);
}

Corpus corpus_of_ids(std::string name, const std::vector<int32_t>& ids, int32_t vocab,
                     nlohmann::json tokenizer, double val_fraction, int64_t seq_len) {
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  auto bytes = std::make_shared<std::vector<uint8_t>>(ids.size() * width);
  for (size_t i = 0; i < ids.size(); ++i) {
    PARM_CHECK(ids[i] >= 0 && ids[i] < vocab, "corpus {}: token {} is id {} of vocabulary {}",
               name, i, ids[i], vocab);
    if (width == 2) {
      const auto v = static_cast<uint16_t>(ids[i]);
      std::memcpy(bytes->data() + 2 * i, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(ids[i]);
      std::memcpy(bytes->data() + 4 * i, &v, 4);
    }
  }
  Corpus c;
  c.name = std::move(name);
  split_tokens(c, TokenSpan(bytes->data(), width, static_cast<int64_t>(ids.size())),
               val_fraction, seq_len);
  c.vocab = vocab;
  c.tokenizer = std::move(tokenizer);
  c.storage = bytes;
  return c;
}

Corpus load_corpus(const std::string& source, double val_fraction, int64_t seq_len) {
  PARM_CONFIG_CHECK(val_fraction > 0 && val_fraction < 0.5,  // before reading the corpus
                    "data.val_fraction {} must be in (0, 0.5)", val_fraction);
  const auto bytes = byte_tokenizer();
  return corpus_of_ids(source, bytes->encode(read_corpus_text(source)), bytes->vocab_size(),
                       bytes->identity(), val_fraction, seq_len);
}

}  // namespace parm::data
