// When the GPU experts' bf16 copies of W1 and W2 (moe/cuda/device_experts.h) must be made
// again: host-side bookkeeping only, so that it is unit-tested without a GPU.
//
// The copies are rounded from the fp32 master weights. They stay valid while the weights are
// the same tensors (same addresses) at the same version: a number that whoever writes the
// weights (an optimizer step, a parameter or checkpoint load) changes with every write and
// hands to the experts (DeviceExperts::set_weights_version). kUnknownVersion, the default,
// means nobody keeps count: every forward pass makes the copies again, as it must when the
// weights may have been written behind the experts' back.
#pragma once

#include <cstdint>

namespace parm::moe {

class Bf16WeightCopies {
 public:
  static constexpr uint64_t kUnknownVersion = 0;

  void set_version(uint64_t v) { version_ = v; }
  uint64_t version() const { return version_; }
  // True when the copies do not hold the weights at (w1, w2) at the current version: the
  // caller rounds them again, then calls made(w1, w2).
  bool stale(const void* w1, const void* w2) const {
    return version_ == kUnknownVersion || !valid_ || w1 != w1_ || w2 != w2_ ||
           version_ != made_version_;
  }
  void made(const void* w1, const void* w2) {
    valid_ = true;
    w1_ = w1;
    w2_ = w2;
    made_version_ = version_;
    ++copies_made_;
  }
  // The copies no longer hold anything (e.g. their buffers were overwritten).
  void forget() { valid_ = false; }
  // How many times the copies were made (tests, benchmarks).
  int64_t copies_made() const { return copies_made_; }

 private:
  uint64_t version_ = kUnknownVersion;
  uint64_t made_version_ = kUnknownVersion;
  bool valid_ = false;
  const void* w1_ = nullptr;
  const void* w2_ = nullptr;
  int64_t copies_made_ = 0;
};

}  // namespace parm::moe
