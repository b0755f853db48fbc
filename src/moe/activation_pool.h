// One set of the activations that --recompute drops, for every MoE layer of a model: what a
// layer would keep from its forward for its backward and can make again in the backward
// without a collective. Each layer names what it needs by key (the experts' activation rows;
// under --recompute moe also the step buffers its compute steps write and every buffer's
// gradient); layers that name the same key share its storage, sized to the largest need. Each
// layer either fills a key before reading it in a pass or reads what its own replay refilled,
// so one set serves every layer and every activation slot of passes that run one at a time.
// Passes that run interleaved (--pp-overlap on: split at the AllToAlls) need one set each:
// the pool holds `lanes` sets, and data() gives the current lane's (set_lane, chosen when a
// pass starts or resumes; a layer's views are re-bound when the lane they were bound to is
// not the current one). Allocated (as activations, parm/memory.h) at the first
// use, after every layer has said what it needs; the storage never moves after that.
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
  explicit ActivationPool(int lanes = 1) : lanes_(lanes) {
    PARM_CHECK(lanes >= 1, "activation pool: {} lanes", lanes);
  }
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
  // The start of key's storage in the current lane (every lane allocated at the first call,
  // on the host).
  float* data(int key) {
    if (allocated_.empty()) {
      MemoryKindScope kind(MemoryKind::kActivations);
      for (int l = 0; l < lanes_; ++l)
        for (int64_t n : need_) allocated_.emplace_back(Shape{n});
    }
    const size_t keys = need_.size();
    PARM_CHECK(static_cast<size_t>(key) < keys && need_[static_cast<size_t>(key)] > 0,
               "activation pool: key {} was never required", key);
    return allocated_[static_cast<size_t>(lane_) * keys + static_cast<size_t>(key)].data();
  }
  int lane() const { return lane_; }
  void set_lane(int lane) {
    PARM_CHECK(lane >= 0 && lane < lanes_, "activation pool: lane {} of {}", lane, lanes_);
    lane_ = lane;
  }
  int64_t bytes() const {
    int64_t b = 0;
    for (int64_t n : need_) b += n * static_cast<int64_t>(sizeof(float));
    return b * lanes_;
  }

 private:
  int lanes_ = 1;
  int lane_ = 0;
  std::vector<int64_t> need_;
  std::vector<Tensor> allocated_;  // lane-major: lane l's key k at l * keys + k
};

}  // namespace parm::moe
