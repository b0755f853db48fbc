// The device record of bad indices (private to src/kernels/cuda/dense_*): a kernel cannot
// throw, so a kernel that meets a token or target outside the vocabulary records it here,
// and check_index_errors() (dense_kernels.h) reads the record later and throws.
//
// A record is one 64-bit word, (row << 32) | (uint32 value), lowered with atomicMin: the
// first bad row wins whatever the order the threads run in, and it carries its value.
// kNoIndexError: nothing recorded.
#pragma once

#include <cstdint>

namespace parm::cuda::dense {

enum class IndexKind { kToken = 0, kTarget = 1, kCount = 2 };
inline constexpr unsigned long long kNoIndexError = ~0ULL;

// The device array of records, one per IndexKind (allocated and cleared on first use).
unsigned long long* index_records();
// What the message needs besides the record, noted by the launcher at each launch: the last
// embedding_forward's sequence length and vocabulary, the last cross_entropy's vocabulary.
void note_token_launch(int64_t seq_len, int64_t vocab);
void note_target_launch(int64_t vocab);
// The vocabulary of the last embedding_forward (INT64_MAX before the first).
int64_t last_token_vocab();

}  // namespace parm::cuda::dense
