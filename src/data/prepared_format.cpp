#include "data/prepared_format.h"

#include <bit>
#include <cstring>
#include <limits>

#include "data/checksum.h"
#include "parm/error.h"

namespace parm::data {
namespace {

// The file is little-endian; so is every machine Parm builds for (x86-64, aarch64 Linux).
static_assert(std::endian::native == std::endian::little, "tokens.bin is little-endian");

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void store(std::string& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}

uint64_t align8(uint64_t x) { return (x + 7) / 8 * 8; }

}  // namespace

uint64_t TokensView::document_start(uint64_t d) const { return load<uint64_t>(index + 8 * d); }

uint32_t TokensView::id(uint64_t i) const {
  return width == 2 ? load<uint16_t>(ids + 2 * i) : load<uint32_t>(ids + 4 * i);
}

std::string tokens_file_bytes(std::span<const int32_t> ids, std::span<const uint64_t> doc_starts,
                              uint32_t vocab) {
  PARM_CHECK(vocab >= 1, "tokens file with an empty vocabulary");
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  const uint64_t n = ids.size(), d = doc_starts.size();
  const uint64_t index_at = align8(kTokensHeaderBytes + n * width);
  std::string out(index_at + 8 * (d + 1), '\0');
  for (uint64_t i = 0; i < n; ++i) {
    PARM_CHECK(ids[i] >= 0 && static_cast<uint32_t>(ids[i]) < vocab,
               "token {} is id {}, outside the vocabulary [0, {})", i, ids[i], vocab);
    if (width == 2) store(out, kTokensHeaderBytes + 2 * i, static_cast<uint16_t>(ids[i]));
    else store(out, kTokensHeaderBytes + 4 * i, static_cast<uint32_t>(ids[i]));
  }
  for (uint64_t k = 0; k < d; ++k) {
    PARM_CHECK(doc_starts[k] <= n &&
                   (k == 0 ? doc_starts[k] == 0 : doc_starts[k] >= doc_starts[k - 1]),
               "document {} starts at {} (tokens {})", k, doc_starts[k], n);
    store(out, index_at + 8 * k, doc_starts[k]);
  }
  store(out, index_at + 8 * d, n);
  std::memcpy(out.data(), kTokensMagic, 8);
  store(out, 8, kTokensVersion);
  store(out, 12, width);
  store(out, 16, vocab);
  store(out, 24, n);
  store(out, 32, d);
  store(out, 40, fnv1a64(out.data() + kTokensHeaderBytes, n * width));
  store(out, 48, fnv1a64(out.data() + index_at, 8 * (d + 1)));
  store(out, 56, fnv1a64(out.data(), 56));
  return out;
}

TokensView parse_tokens_file(const uint8_t* b, uint64_t size, const std::string& file) {
  PARM_CONFIG_CHECK(size >= kTokensHeaderBytes,
                    "prepared dataset {}: truncated ({} bytes; the header alone is {})", file,
                    size, kTokensHeaderBytes);
  PARM_CONFIG_CHECK(std::memcmp(b, kTokensMagic, 8) == 0,
                    "prepared dataset {}: wrong magic (not a Parm tokens file; expected "
                    "\"PARMTOK\\x01\")",
                    file);
  const uint32_t version = load<uint32_t>(b + 8);
  PARM_CONFIG_CHECK(version == kTokensVersion,
                    "prepared dataset {}: version {} is not supported (this build reads version "
                    "{}); prepare it again with parm prepare-data",
                    file, version, kTokensVersion);
  PARM_CONFIG_CHECK(load<uint64_t>(b + 56) == fnv1a64(b, 56),
                    "prepared dataset {}: header checksum mismatch (the header is corrupt)", file);
  TokensView v;
  v.width = load<uint32_t>(b + 12);
  v.vocab = load<uint32_t>(b + 16);
  v.tokens = load<uint64_t>(b + 24);
  v.documents = load<uint64_t>(b + 32);
  PARM_CONFIG_CHECK(v.width == 2 || v.width == 4,
                    "prepared dataset {}: {} bytes per id; valid: 2 (uint16) or 4 (uint32)", file,
                    v.width);
  PARM_CONFIG_CHECK(v.vocab >= 1 && (v.width == 4 || v.vocab <= 65536),
                    "prepared dataset {}: vocabulary {} does not fit {}-byte ids", file, v.vocab,
                    v.width);
  PARM_CONFIG_CHECK(load<uint32_t>(b + 20) == 0, "prepared dataset {}: reserved field is not 0",
                    file);
  // Sizes in overflow-free steps: every count is bounded by the file's size first.
  const uint64_t room = size - kTokensHeaderBytes;
  PARM_CONFIG_CHECK(v.tokens <= room / v.width && v.documents < room / 8,
                    "prepared dataset {}: truncated ({} bytes for {} tokens of {} bytes and {} "
                    "documents)",
                    file, size, v.tokens, v.width, v.documents);
  const uint64_t index_at = align8(kTokensHeaderBytes + v.tokens * v.width);
  const uint64_t expected = index_at + 8 * (v.documents + 1);
  PARM_CONFIG_CHECK(index_at <= size && size == expected,
                    "prepared dataset {}: {} bytes, but the header's {} tokens and {} documents "
                    "need {}{}",
                    file, size, v.tokens, v.documents, expected,
                    size < expected ? " (truncated)" : " (trailing bytes)");
  v.ids = b + kTokensHeaderBytes;
  v.index = b + index_at;
  for (uint64_t at = kTokensHeaderBytes + v.tokens * v.width; at < index_at; ++at)
    PARM_CONFIG_CHECK(b[at] == 0, "prepared dataset {}: padding byte {} is not 0", file, at);
  PARM_CONFIG_CHECK(load<uint64_t>(b + 40) == fnv1a64(v.ids, v.tokens * v.width),
                    "prepared dataset {}: checksum mismatch in the token ids (the file is corrupt)",
                    file);
  PARM_CONFIG_CHECK(load<uint64_t>(b + 48) == fnv1a64(v.index, 8 * (v.documents + 1)),
                    "prepared dataset {}: checksum mismatch in the document index", file);
  PARM_CONFIG_CHECK(v.document_start(0) == 0 && v.document_start(v.documents) == v.tokens,
                    "prepared dataset {}: the document index must start at 0 and end at the "
                    "token count {} (it runs from {} to {})",
                    file, v.tokens, v.document_start(0), v.document_start(v.documents));
  for (uint64_t d = 0; d < v.documents; ++d)
    PARM_CONFIG_CHECK(v.document_start(d) <= v.document_start(d + 1),
                      "prepared dataset {}: document {} starts at {}, after document {}'s {}",
                      file, d, v.document_start(d), d + 1, v.document_start(d + 1));
  uint32_t max_id = 0;
  uint64_t max_at = 0;
  for (uint64_t i = 0; i < v.tokens; ++i) {
    const uint32_t id = v.id(i);
    if (id > max_id) {
      max_id = id;
      max_at = i;
    }
  }
  PARM_CONFIG_CHECK(v.tokens == 0 || max_id < v.vocab,
                    "prepared dataset {}: token {} is id {}, outside the vocabulary [0, {})",
                    file, max_at, max_id, v.vocab);
  return v;
}

}  // namespace parm::data
