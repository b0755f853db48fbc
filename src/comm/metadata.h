// Small int32 side exchanges that travel with a collective (the MoE dispatch's per-expert
// fill counts), posted as point-to-point messages so that they run while the data
// collective is in flight, and counted as CommOp::kMetadata on their group (never under
// the data collective's own op, whose counts stay the data it moves).
//
// One exchange at a time per object; the object keeps its request list between calls, so
// the steady state (same group sizes) allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "parm/comm.h"

namespace parm {

// Point-to-point tag of the metadata messages (reserved, like the fused collectives' tags).
constexpr int kMetadataTag = kFusedTagBase - 1;

class MetadataExchange {
 public:
  // recv (size, count) block p = send block p of peer p: send is (size, count).
  void post_alltoall(Communicator& c, const int32_t* send, int32_t* recv, size_t count);
  // recv (size, count) block p = peer p's send (count).
  void post_allgather(Communicator& c, const int32_t* send, int32_t* recv, size_t count);
  // Waits for the posted exchange and records one kMetadata call (bytes received from
  // peers) on its communicator. No-op when nothing is posted.
  void wait();

 private:
  void post(Communicator& c, const int32_t* send, size_t send_stride, int32_t* recv,
            size_t count);

  Communicator* comm_ = nullptr;
  std::vector<RequestPtr> requests_;
  double received_bytes_ = 0.0;
  double start_us_ = 0.0;
};

}  // namespace parm
