#include "comm/staged_communicator.h"

#include <algorithm>
#include <memory>

#include "comm/fused_any.h"
#include "comm/tracked_request.h"
#include "parm/device.h"
#include "parm/error.h"

namespace parm {
namespace {

class StagedRequest final : public TrackedRequest {
 public:
  StagedRequest(StagedCommunicator* owner, RequestPtr host_req, void* device_dst,
                const void* host_src, size_t bytes, StagedCommunicator::Buffer a,
                StagedCommunicator::Buffer b)
      : owner_(owner), host_req_(std::move(host_req)), device_dst_(device_dst),
        host_src_(host_src), bytes_(bytes), a_(std::move(a)), b_(std::move(b)) {}
  ~StagedRequest() override {
    settle();
    if (failed()) {
      // The host operation may still write into (or read) the staging buffers: abandoned,
      // never handed out again.
      (void)a_.data.release();
      (void)b_.data.release();
    }
  }

 private:
  bool poll() override { return host_req_->test(); }
  // Not reached: block() waits through the host request, whose watchdog bounds the wait.
  void watchdog() override {}
  void block() override { host_req_->wait(); }
  void on_done() override {
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
};

// Every buffer counts as device memory: host memory standing in for it (the CPU emulation).
MemorySpace all_device(const void*) { return MemorySpace::kDevice; }

// The host staging areas of the fused collectives, recycled across calls (the executor runs
// one fused collective at a time per thread). After a failure they are abandoned, like a
// failed request's buffers: the host pipeline's abandoned receives may still write into them.
struct HostAreas {
  std::unique_ptr<float[]> data[3];
  size_t floats[3] = {0, 0, 0};

  float* get(int slot, size_t bytes) {
    const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
    if (floats[slot] < n) {
      data[slot] = std::make_unique_for_overwrite<float[]>(n);
      floats[slot] = n;
    }
    return data[slot].get();
  }
  void abandon() {
    for (int i = 0; i < 3; ++i) {
      (void)data[i].release();
      floats[i] = 0;
    }
  }
};
thread_local HostAreas host_areas;

// Runs a fused host pipeline over the staging areas; abandons them if it fails.
template <typename F>
void on_host_areas(F&& run) {
  try {
    run(host_areas);
  } catch (...) {
    host_areas.abandon();
    throw;
  }
}

}  // namespace

StagedCommunicator::StagedCommunicator(Communicator& host, CopyFn copy, SpaceOfFn space_of)
    : LayeredCommunicator(host), host_(host), copy_(copy != nullptr ? copy : &device_copy),
      space_of_(space_of != nullptr ? space_of
                                    : copy != nullptr ? &all_device : &cuda_space_of) {}

StagedCommunicator::~StagedCommunicator() = default;

void StagedCommunicator::run_fused_dispatch(Communicator& esp_any, const float* in, float* out,
                                            size_t block, int chunks) {
  StagedCommunicator& esp = same_backend(*this, esp_any, "fused dispatch");
  const size_t in_bytes = block * static_cast<size_t>(size()) * sizeof(float);
  const size_t out_bytes = in_bytes * static_cast<size_t>(esp.size());
  on_host_areas([&](HostAreas& areas) {
    float* hin = areas.get(0, in_bytes);
    float* hout = areas.get(1, out_bytes);
    copy_(hin, in, in_bytes);
    fused_dispatch(host_, esp.host(), hin, hout, block, chunks);
    copy_(out, hout, out_bytes);
  });
}

void StagedCommunicator::run_fused_combine(Communicator& ep_any, const float* in, float* out,
                                           size_t block, int chunks,
                                           const MpGatherPart* mp_part) {
  StagedCommunicator& ep = same_backend(*this, ep_any, "fused combine");
  StagedCommunicator* mp = mp_part != nullptr && mp_part->mp != nullptr
                               ? &same_backend(*this, *mp_part->mp, "fused combine")
                               : nullptr;
  const size_t out_bytes = block * static_cast<size_t>(ep.size()) * sizeof(float);
  const size_t in_bytes = out_bytes * static_cast<size_t>(size());
  on_host_areas([&](HostAreas& areas) {
    float* hin = areas.get(0, in_bytes);
    float* hout = areas.get(1, out_bytes);
    copy_(hin, in, in_bytes);
    if (mp == nullptr) {
      fused_combine(host_, ep.host(), hin, hout, block, chunks);
      copy_(out, hout, out_bytes);
      return;
    }
    const size_t full_bytes = out_bytes * static_cast<size_t>(mp->size());
    MpGatherPart host_mp{&mp->host(), mp_part->outer, mp_part->chunk, areas.get(2, full_bytes)};
    fused_combine(host_, ep.host(), hin, hout, block, chunks, &host_mp);
    copy_(out, hout, out_bytes);
    copy_(mp_part->full, host_mp.full, full_bytes);
  });
}

RequestPtr StagedCommunicator::finish(RequestPtr host_req, void* device_dst,
                                      const void* host_src, size_t result_bytes, Buffer a,
                                      Buffer b) {
  return std::make_unique<StagedRequest>(this, std::move(host_req), device_dst, host_src,
                                         result_bytes, std::move(a), std::move(b));
}

RequestPtr StagedCommunicator::do_iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  copy_(h.data.get(), buf, bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.iallreduce(hp, count, dtype, op);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

// The shape every out-of-place collective shares: `send_bytes` of send staged in, the host
// op posted on the staging buffers, `recv_bytes` staged back into recv on completion.
template <typename Post>
RequestPtr StagedCommunicator::staged_out_of_place(const void* send, size_t send_bytes,
                                                   void* recv, size_t recv_bytes,
                                                   const Post& post) {
  Buffer hs = take(send_bytes), hr = take(recv_bytes);
  copy_(hs.data.get(), send, send_bytes);  // before the host call: send may lie inside recv
  void* hrp = hr.data.get();
  RequestPtr r = post(hs.data.get(), hrp);
  return finish(std::move(r), recv, hrp, recv_bytes, std::move(hs), std::move(hr));
}

RequestPtr StagedCommunicator::do_iallgather(const void* send, void* recv, size_t count,
                                             DType dtype) {
  const size_t block = count * dtype_size(dtype);
  return staged_out_of_place(send, block, recv, block * static_cast<size_t>(size()),
                             [&](const void* hs, void* hr) {
                               return host_.iallgather(hs, hr, count, dtype);
                             });
}

RequestPtr StagedCommunicator::do_ireduce_scatter(const void* send, void* recv, size_t count,
                                                  DType dtype) {
  const size_t block = count * dtype_size(dtype);
  return staged_out_of_place(send, block * static_cast<size_t>(size()), recv, block,
                             [&](const void* hs, void* hr) {
                               return host_.ireduce_scatter(hs, hr, count, dtype);
                             });
}

RequestPtr StagedCommunicator::do_ialltoall(const void* send, void* recv, size_t count,
                                            DType dtype) {
  const size_t total = count * dtype_size(dtype) * static_cast<size_t>(size());
  return staged_out_of_place(send, total, recv, total, [&](const void* hs, void* hr) {
    return host_.ialltoall(hs, hr, count, dtype);
  });
}

RequestPtr StagedCommunicator::do_ialltoallv(const void* send, const size_t* send_counts,
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

RequestPtr StagedCommunicator::do_ibarrier() { return host_.ibarrier(); }

RequestPtr StagedCommunicator::do_ibroadcast(void* buf, size_t count, DType dtype, int root) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  if (rank() == root) copy_(h.data.get(), buf, bytes);
  void* hp = h.data.get();
  RequestPtr r = host_.ibroadcast(hp, count, dtype, root);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

RequestPtr StagedCommunicator::do_isend(const void* buf, size_t count, DType dtype, int peer,
                                        int tag, bool counted) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  copy_(h.data.get(), buf, bytes);
  RequestPtr r = counted ? host_.isend(h.data.get(), count, dtype, peer, tag)
                         : host_.isend_uncounted(h.data.get(), count, dtype, peer, tag);
  return finish(std::move(r), nullptr, nullptr, 0, std::move(h), {});
}

RequestPtr StagedCommunicator::do_irecv(void* buf, size_t count, DType dtype, int peer, int tag,
                                        bool counted) {
  const size_t bytes = count * dtype_size(dtype);
  Buffer h = take(bytes);
  void* hp = h.data.get();
  RequestPtr r = counted ? host_.irecv(hp, count, dtype, peer, tag)
                         : host_.irecv_uncounted(hp, count, dtype, peer, tag);
  return finish(std::move(r), buf, hp, bytes, std::move(h), {});
}

}  // namespace parm
