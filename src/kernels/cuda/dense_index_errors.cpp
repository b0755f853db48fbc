// The bad-index record of the dense kernels (dense_index_errors.h) and check_index_errors().
#include "kernels/cuda/dense_index_errors.h"

#include <limits>

#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/runtime.h"
#include "parm/device.h"
#include "parm/error.h"

namespace parm::cuda::dense {
namespace {

constexpr size_t kRecordBytes = static_cast<size_t>(IndexKind::kCount) * sizeof(unsigned long long);

struct LaunchNotes {
  int64_t seq_len = 1;
  int64_t token_vocab = std::numeric_limits<int64_t>::max();
  int64_t target_vocab = std::numeric_limits<int64_t>::max();
};
LaunchNotes& notes() {
  static LaunchNotes n;
  return n;
}

void clear(unsigned long long* records) {
  PARM_CUDA_CHECK(cudaMemsetAsync(records, 0xff, kRecordBytes, stream()));
}

}  // namespace

unsigned long long* index_records() {
  static unsigned long long* records = [] {
    auto* r = static_cast<unsigned long long*>(device_alloc(kRecordBytes));
    clear(r);
    return r;
  }();
  return records;
}

void note_token_launch(int64_t seq_len, int64_t vocab) {
  notes().seq_len = seq_len < 1 ? 1 : seq_len;
  notes().token_vocab = vocab;
}
void note_target_launch(int64_t vocab) { notes().target_vocab = vocab; }
int64_t last_token_vocab() { return notes().token_vocab; }

}  // namespace parm::cuda::dense

namespace parm::cuda {

void check_index_errors() {
  using dense::IndexKind;
  unsigned long long* records = dense::index_records();
  unsigned long long host[static_cast<int>(IndexKind::kCount)];
  device_copy(host, records, sizeof(host));  // waits for the queued kernels
  const unsigned long long token = host[static_cast<int>(IndexKind::kToken)];
  const unsigned long long target = host[static_cast<int>(IndexKind::kTarget)];
  if (token == dense::kNoIndexError && target == dense::kNoIndexError) return;
  PARM_CUDA_CHECK(cudaMemsetAsync(records, 0xff, sizeof(host), stream()));
  const dense::LaunchNotes& n = dense::notes();
  if (token != dense::kNoIndexError) {
    const int64_t row = static_cast<int64_t>(token >> 32);
    const int32_t value = static_cast<int32_t>(static_cast<uint32_t>(token & 0xffffffffu));
    PARM_CHECK(token == dense::kNoIndexError, "token {} at (sequence {}, position {}) is outside the vocabulary [0, {})",
               value, row / n.seq_len, row % n.seq_len, n.token_vocab);
  }
  const int64_t row = static_cast<int64_t>(target >> 32);
  const int32_t value = static_cast<int32_t>(static_cast<uint32_t>(target & 0xffffffffu));
  PARM_CHECK(target == dense::kNoIndexError, "target {} of counted row {} is outside the vocabulary [0, {})", value, row,
             n.target_vocab);
}

}  // namespace parm::cuda
