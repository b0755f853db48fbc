// The base of a communicator that moves buffers its own way over the same group as a host
// communicator (staging device buffers through host memory; NCCL): the group's identity,
// deadline and counters are the host's, so a group has one set of counters whichever
// backend moved its bytes.
#pragma once

#include <string>

#include "parm/comm.h"

namespace parm {

class LayeredCommunicator : public Communicator {
 public:
  // `host` must outlive this object.
  explicit LayeredCommunicator(Communicator& host) : identity_(host) {}

  const std::string& name() const override { return identity_.name(); }
  int rank() const override { return identity_.rank(); }
  int size() const override { return identity_.size(); }
  int world_rank() const override { return identity_.world_rank(); }
  bool intra_node() const override { return identity_.intra_node(); }
  CommStats& stats() override { return identity_.stats(); }
  double timeout_s() const override { return identity_.timeout_s(); }

 private:
  Communicator& identity_;
};

}  // namespace parm
