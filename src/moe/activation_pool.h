// One set of the activations that --recompute drops, for every MoE layer of a model: what a
// layer would keep from its forward for its backward and can make again in the backward
// without a collective. Each layer names what it needs by key (the experts' activation rows;
// under --recompute moe also the step buffers its compute steps write and every buffer's
// gradient); layers that name the same key share its storage, sized to the largest need. The
// layers of a model run one pass at a time (no split passes), and each either fills a key
// before reading it in that pass or reads what its own replay refilled, so one set serves
// every layer and every activation slot. Allocated (as activations, parm/memory.h) at the
// first use, after every layer has said what it needs; the storage never moves after that.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "parm/error.h"
#include "parm/memory.h"
#include "parm/tensor.h"

namespace parm::moe {

class ActivationPool {
 public:
  // The experts' activation rows (moe_ops.h's ExpertWorkspace).
  enum Rows { kIn = 0, kPre, kAct, kGate, kNumRows };
  // Step buffer `id`'s value or gradient (moe/step_buffers.h).
  static int buffer_key(int id, bool grad) { return kNumRows + 2 * id + (grad ? 1 : 0); }

  // A layer needs `numel` floats under `key` (before the first data() call).
  void require(int key, int64_t numel) {
    PARM_CHECK(allocated_.empty(), "the activation pool is already in use; a layer built "
               "after the first pass cannot join it");
    if (static_cast<size_t>(key) >= need_.size()) need_.resize(static_cast<size_t>(key) + 1, 0);
    auto& n = need_[static_cast<size_t>(key)];
    n = std::max(n, numel);
  }
  // The start of key's storage (everything allocated at the first call, on the host).
  float* data(int key) {
    if (allocated_.empty()) {
      MemoryKindScope kind(MemoryKind::kActivations);
      for (int64_t n : need_) allocated_.emplace_back(Shape{n});
    }
    PARM_CHECK(static_cast<size_t>(key) < allocated_.size() &&
                   allocated_[static_cast<size_t>(key)].numel() > 0,
               "activation pool: key {} was never required", key);
    return allocated_[static_cast<size_t>(key)].data();
  }
  int64_t bytes() const {
    int64_t b = 0;
    for (int64_t n : need_) b += n * static_cast<int64_t>(sizeof(float));
    return b;
  }

 private:
  std::vector<int64_t> need_;
  std::vector<Tensor> allocated_;
};

}  // namespace parm::moe
