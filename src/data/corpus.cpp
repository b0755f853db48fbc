#include "data/corpus.h"

#include <cstdio>
#include <cstring>

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

Corpus load_corpus(const std::string& source, double val_fraction, int64_t seq_len) {
  PARM_CONFIG_CHECK(val_fraction > 0 && val_fraction < 0.5,
                    "data.val_fraction {} must be in (0, 0.5)", val_fraction);
  std::string text;
  if (source == "kjv") {
    text = read_kjv();
  } else if (source.rfind("file:", 0) == 0) {
    const std::string path = source.substr(5);
    try {
      text = read_file(path);
    } catch (const Error& e) {
      throw InvalidConfig(fmt::format("corpus {}: {}", source, e.what()));
    }
  } else {
    throw InvalidConfig(fmt::format(
        "unknown corpus '{}'; valid: \"kjv\" (Debian's bible-kjv) or \"file:PATH\"", source));
  }
  Corpus c;
  c.name = source;
  const size_t val_bytes = static_cast<size_t>(static_cast<double>(text.size()) * val_fraction);
  const size_t train_bytes = text.size() - val_bytes;
  c.train.assign(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(train_bytes));
  c.val.assign(text.begin() + static_cast<std::ptrdiff_t>(train_bytes), text.end());
  PARM_CONFIG_CHECK(static_cast<int64_t>(c.val.size()) > seq_len + 1 &&
                        static_cast<int64_t>(c.train.size()) > seq_len + 1,
                    "corpus {} ({} bytes) is too short for sequences of {} tokens with "
                    "val_fraction {}",
                    source, text.size(), seq_len, val_fraction);
  return c;
}

}  // namespace parm::data
