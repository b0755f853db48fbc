// Prepared token datasets: a corpus tokenized once, read by every training run through a
// memory map (the role of Megatron's indexed datasets and nanoGPT's .bin files).
//
// A dataset is a folder, written whole to DIR.tmp and renamed to DIR (never half-written):
//
//   DIR/dataset.json     {"format": "parm-tokens", "version": 1, "corpus": "kjv",
//                         "tokenizer": {"kind": .., "vocab": V, "fnv1a64": .., "file": ..},
//                         "tokens": N, "documents": D, "dtype": "uint16" | "uint32",
//                         "tokens_file": "tokens.bin"}
//   DIR/tokenizer.model  the tokenizer's model file (SentencePiece; absent for byte)
//   DIR/tokens.bin       little-endian:
//     [0, 8)    magic "PARMTOK\x01"
//     [8, 12)   u32 version (1)
//     [12, 16)  u32 bytes per id: 2 (uint16, vocabularies up to 65536) or 4 (uint32)
//     [16, 20)  u32 V, the vocabulary: every id < V
//     [20, 24)  u32 0 (reserved)
//     [24, 32)  u64 N, the token count
//     [32, 40)  u64 D, the document count
//     [40, 48)  u64 FNV-1a 64 of the ids' bytes
//     [48, 56)  u64 FNV-1a 64 of the index's bytes
//     [56, 64)  u64 FNV-1a 64 of bytes [0, 56)
//     [64, 64 + N w)           the ids, in corpus order (w = bytes per id)
//     zero bytes up to the next multiple of 8
//     [I, I + 8 (D + 1))       the index: D + 1 u64 offsets, index[0] = 0, index[D] = N,
//                              non-decreasing; document d is ids [index[d], index[d + 1])
//   and nothing after it.
//
// A document is one line of the corpus with its '\n' (the King James text: one verse), each
// tokenized on its own, so that no token spans two. Token positions (the train/validation split,
// the sequences a data position names) count ids of this file, the same under any layout.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace parm::data {

constexpr char kTokensMagic[8] = {'P', 'A', 'R', 'M', 'T', 'O', 'K', '\x01'};
constexpr uint32_t kTokensVersion = 1;
constexpr size_t kTokensHeaderBytes = 64;
constexpr const char* kDatasetFormat = "parm-tokens";
constexpr int kDatasetVersion = 1;

// The checked contents of a tokens.bin image: views into the caller's bytes.
struct TokensView {
  uint32_t width = 0;   // bytes per id: 2 or 4
  uint32_t vocab = 0;
  uint64_t tokens = 0;  // N
  uint64_t documents = 0;  // D
  const uint8_t* ids = nullptr;        // N * width bytes
  const uint8_t* index = nullptr;      // (D + 1) u64, possibly unaligned in a test's buffer
  uint64_t document_start(uint64_t d) const;  // index[d], d <= D
  uint32_t id(uint64_t i) const;
};

// The bytes of a tokens.bin holding `ids` (each < vocab) and documents starting at
// `doc_starts` (ascending, the first 0, each <= ids.size()).
std::string tokens_file_bytes(std::span<const int32_t> ids, std::span<const uint64_t> doc_starts,
                              uint32_t vocab);

// Checks every field of a tokens.bin image of `size` bytes: the size against the header,
// the magic, the version, the width, the checksums, the index (0 first, N last,
// non-decreasing) and every id < the header's vocabulary. Throws parm::InvalidConfig naming
// `file` and what is wrong (and what would be valid). Reads the whole image once.
TokensView parse_tokens_file(const uint8_t* bytes, uint64_t size, const std::string& file);

}  // namespace parm::data
