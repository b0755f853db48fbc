#include "comm/metadata.h"

#include <cstring>

#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

void MetadataExchange::post_alltoall(Communicator& c, const int32_t* send, int32_t* recv,
                                     size_t count) {
  post(c, send, count, recv, count);
}

void MetadataExchange::post_allgather(Communicator& c, const int32_t* send, int32_t* recv,
                                      size_t count) {
  post(c, send, 0, recv, count);
}

// Peer p gets send + p * send_stride (count int32); recv block p comes from peer p. This
// rank's own block is a local copy.
void MetadataExchange::post(Communicator& c, const int32_t* send, size_t send_stride,
                            int32_t* recv, size_t count) {
  PARM_CHECK(comm_ == nullptr, "metadata exchange on {} posted twice", c.name());
  comm_ = &c;
  start_us_ = now_us();
  const int n = c.size(), me = c.rank();
  std::memmove(recv + static_cast<size_t>(me) * count,
               send + static_cast<size_t>(me) * send_stride, count * sizeof(int32_t));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    requests_.push_back(c.irecv_uncounted(recv + static_cast<size_t>(p) * count, count,
                                          DType::kI32, p, kMetadataTag));
    requests_.push_back(c.isend_uncounted(send + static_cast<size_t>(p) * send_stride, count,
                                          DType::kI32, p, kMetadataTag));
  }
  received_bytes_ = static_cast<double>((n - 1) * count * sizeof(int32_t));
}

void MetadataExchange::wait() {
  if (comm_ == nullptr) return;
  Communicator* c = comm_;
  comm_ = nullptr;
  wait_all(requests_);  // clears the list, keeps its capacity
  c->record(CommOp::kMetadata, received_bytes_, now_us() - start_us_);
}

}  // namespace parm
