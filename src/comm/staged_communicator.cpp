#include "comm/staged_communicator.h"

#include <algorithm>

#include "parm/device.h"
#include "parm/error.h"

namespace parm {
namespace {

class StagedRequest final : public Request {
 public:
  StagedRequest(StagedCommunicator* owner, RequestPtr host_req, void* device_dst,
                const void* host_src, size_t bytes, StagedCommunicator::Buffer a,
                StagedCommunicator::Buffer b)
      : owner_(owner), host_req_(std::move(host_req)), device_dst_(device_dst),
        host_src_(host_src), bytes_(bytes), a_(std::move(a)), b_(std::move(b)) {}
  ~StagedRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {  // a destructor must not throw; the failure was (or will be) reported
    }
  }
  bool test() override {
    if (done_) return true;
    if (!host_req_->test()) return false;
    complete();
    return true;
  }
  void wait() override {
    if (done_) return;
    host_req_->wait();
    complete();
  }

 private:
  void complete() {
    done_ = true;
    if (bytes_ > 0) owner_->copy_fn()(device_dst_, host_src_, bytes_);
    owner_->give_back(std::move(a_));
    owner_->give_back(std::move(b_));
  }

  StagedCommunicator* owner_;
  RequestPtr host_req_;
  void* device_dst_;
  const void* host_src_;
  size_t bytes_;
  StagedCommunicator::Buffer a_, b_;
  bool done_ = false;
};

}  // namespace

StagedCommunicator::StagedCommunicator(Communicator& host, CopyFn copy)
    : host_(host), copy_(copy != nullptr ? copy : &device_copy) {}

StagedCommunicator::~StagedCommunicator() = default;

RequestPtr StagedCommunicator::finish(RequestPtr host_req, void* device_dst,
                                      const void* host_src, size_t result_bytes, Buffer a,
                                      Buffer b) {
  return std::make_unique<StagedRequest>(this, std::move(host_req), device_dst, host_src,
                                         result_bytes, std::move(a), std::move(b));
}

RequestPtr StagedCommunicator::iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  copy_(h.data.get(), buf, bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.iallreduce(hp, count, dtype, op);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

RequestPtr StagedCommunicator::iallgather(const void* send, void* recv, size_t count,
                                          DType dtype) {
  const size_t block = count * dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size());
  Buffer hs = take(block), hr = take(total);
  copy_(hs.data.get(), send, block);  // before the host call: send may lie inside recv
  void* hrp = hr.data.get();
  RequestPtr r = host_.iallgather(hs.data.get(), hrp, count, dtype);
  return finish(std::move(r), recv, hrp, total,
                std::move(hs), std::move(hr));
}

RequestPtr StagedCommunicator::ireduce_scatter(const void* send, void* recv, size_t count,
                                               DType dtype) {
  const size_t block = count * dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size());
  Buffer hs = take(total), hr = take(block);
  copy_(hs.data.get(), send, total);
  void* hrp = hr.data.get();
  RequestPtr r = host_.ireduce_scatter(hs.data.get(), hrp, count, dtype);
  return finish(std::move(r), recv, hrp, block,
                std::move(hs), std::move(hr));
}

RequestPtr StagedCommunicator::ialltoall(const void* send, void* recv, size_t count,
                                         DType dtype) {
  const size_t total = count * dtype_size(dtype) * static_cast<size_t>(size());
  Buffer hs = take(total), hr = take(total);
  copy_(hs.data.get(), send, total);
  void* hrp = hr.data.get();
  RequestPtr r = host_.ialltoall(hs.data.get(), hrp, count, dtype);
  return finish(std::move(r), recv, hrp, total,
                std::move(hs), std::move(hr));
}

RequestPtr StagedCommunicator::ialltoallv(const void* send, const size_t* send_counts,
                                          const size_t* send_displs, void* recv,
                                          const size_t* recv_counts, const size_t* recv_displs,
                                          DType dtype) {
  // Stage the spans [0, max(displ + count)) of both sides; the layouts stay as given.
  const size_t es = dtype_size(dtype);
  size_t send_end = 0, recv_end = 0;
  for (int p = 0; p < size(); ++p) {
    send_end = std::max(send_end, send_displs[p] + send_counts[p]);
    recv_end = std::max(recv_end, recv_displs[p] + recv_counts[p]);
  }
  Buffer hs = take(send_end * es), hr = take(recv_end * es);
  copy_(hs.data.get(), send, send_end * es);
  // Parts of recv that no peer writes keep their values, as in the unstaged call.
  copy_(hr.data.get(), recv, recv_end * es);
  void* hrp = hr.data.get();
  RequestPtr r = host_.ialltoallv(hs.data.get(), send_counts, send_displs, hrp, recv_counts,
                                 recv_displs, dtype);
  return finish(std::move(r),
                recv, hrp, recv_end * es, std::move(hs), std::move(hr));
}

RequestPtr StagedCommunicator::ibroadcast(void* buf, size_t count, DType dtype, int root) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  if (rank() == root) copy_(h.data.get(), buf, bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.ibroadcast(hp, count, dtype, root);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

RequestPtr StagedCommunicator::isend(const void* buf, size_t count, DType dtype, int peer,
                                     int tag) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  copy_(h.data.get(), buf, bytes);
  RequestPtr r = host_.isend(h.data.get(), count, dtype, peer, tag);
  return finish(std::move(r), nullptr, nullptr, 0,
                std::move(h), {});
}

RequestPtr StagedCommunicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.irecv(hp, count, dtype, peer, tag);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

RequestPtr StagedCommunicator::isend_uncounted(const void* buf, size_t count, DType dtype,
                                               int peer, int tag) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  copy_(h.data.get(), buf, bytes);
  RequestPtr r = host_.isend_uncounted(h.data.get(), count, dtype, peer, tag);
  return finish(std::move(r), nullptr, nullptr,
                0, std::move(h), {});
}

RequestPtr StagedCommunicator::irecv_uncounted(void* buf, size_t count, DType dtype, int peer,
                                               int tag) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.irecv_uncounted(hp, count, dtype, peer, tag);
  return finish(std::move(r), buf, hp, bytes,
                std::move(h), {});
}

}  // namespace parm
