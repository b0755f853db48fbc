// When the device experts run a pass from a CUDA graph (header-only and free of CUDA, so the
// CPU unit tests check it): a pass is fixed by its key (every pointer it reads or writes and
// every size and fill count it launches with); two passes with equal keys queue the same
// launches with the same arguments, so the second may be captured and every later one
// replayed. A pass with another key runs as it is (eagerly) and starts over.
#pragma once

#include <cstdint>
#include <vector>

namespace parm::moe::cuda {

// What fixes a pass's launches.
struct PassKey {
  std::vector<const void*> pointers;
  std::vector<int64_t> sizes;
  std::vector<int32_t> fills;

  void clear() {
    pointers.clear();
    sizes.clear();
    fills.clear();
  }
  bool operator==(const PassKey& o) const {
    return pointers == o.pointers && sizes == o.sizes && fills == o.fills;
  }
};

class GraphPolicy {
 public:
  enum class Action {
    kEager,    // run the pass's launches as they are
    kCapture,  // record them into the graph (then launch it), replacing any earlier graph
    kReplay,   // launch the graph recorded for this key
  };

  // The action for a pass with this key (disabled: always kEager). After kCapture the caller
  // reports the outcome with captured().
  Action next(const PassKey& key) {
    if (!enabled_) return count(Action::kEager);
    if (have_graph_ && key == graph_key_) return count(Action::kReplay);
    if (have_last_ && key == last_key_) {
      graph_key_ = key;
      have_graph_ = false;  // until captured(true)
      return count(Action::kCapture);
    }
    last_key_ = key;
    have_last_ = true;
    return count(Action::kEager);
  }
  // After kCapture: ok, the graph holds the pass of the key given; not ok, capture failed
  // (something in the pass cannot be captured) and this policy runs everything eagerly from
  // now on.
  void captured(bool ok) {
    have_graph_ = ok;
    if (!ok) {
      enabled_ = false;
      failed_ = true;
    }
  }

  // On by default only where the owner turns it on; turning it off or on forgets the keys.
  void set_enabled(bool on) {
    enabled_ = on && !failed_;
    have_last_ = have_graph_ = false;
  }
  bool enabled() const { return enabled_; }
  bool capture_failed() const { return failed_; }

  // Passes per action so far.
  int64_t eager() const { return counts_[0]; }
  int64_t captures() const { return counts_[1]; }
  int64_t replays() const { return counts_[2]; }

 private:
  Action count(Action a) {
    ++counts_[static_cast<int>(a)];
    return a;
  }
  bool enabled_ = false, failed_ = false;
  bool have_last_ = false, have_graph_ = false;
  PassKey last_key_, graph_key_;
  int64_t counts_[3] = {0, 0, 0};
};

}  // namespace parm::moe::cuda
