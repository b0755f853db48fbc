// A communicator over device buffers that moves them through host memory with a host
// communicator (MPI): each operation copies its device input to a host staging buffer,
// runs the host operation there, and copies the result back to the device when it
// completes. It is how several ranks share one GPU (NCCL refuses two ranks on one device)
// and how a machine without NCCL runs the CUDA backend; on a real multi-GPU node the NCCL
// communicator moves device buffers directly.
//
// The fused collectives run fused.h's host pipeline over the host communicators, their input
// and output staged (all groups must be staged communicators).
//
// Counters: the host communicator's (one set per group, whatever moved the bytes); times
// count the host operation, not the staging copies. Staging buffers are recycled, so a
// steady state of same-sized operations allocates no host memory. A request whose host
// operation failed (a Timeout) never copies into its destination and abandons its staging
// buffers (the host library may still write into them); it rethrows its error on every
// later wait (tracked_request.h).
//
// Memory space: device. The CPU emulation (a plain memcpy as `copy`, TopologyOptions::
// stage_host_buffers) lets host memory stand in for device memory; a test can pass its own
// SpaceOfFn to see wrongly placed buffers refused there too.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "comm/layered_communicator.h"
#include "comm/scratch_pool.h"
#include "parm/comm.h"

namespace parm {

class StagedCommunicator final : public LayeredCommunicator {
 public:
  // Copies between device and host memory (both directions; returns when done).
  using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

  // `host` must outlive this object. `copy` defaults to parm::device_copy; tests pass a
  // plain memcpy to check the staging over host memory. `space_of` tells a buffer's space:
  // null means cuda_space_of with the default copy, and with a custom copy (the CPU
  // emulation) that every buffer counts as device memory.
  explicit StagedCommunicator(Communicator& host, CopyFn copy = nullptr,
                              SpaceOfFn space_of = nullptr);
  ~StagedCommunicator() override;

  Communicator& host() { return host_; }
  CopyFn copy_fn() const { return copy_; }

  const char* backend() const override { return "staged"; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  MemorySpace space_of(const void* p) const override { return space_of_(p); }

  // Host staging buffers, recycled.
  using Buffer = ScratchPool::Buffer;
  Buffer take(size_t bytes) { return pool_.take(bytes); }
  void give_back(Buffer b) { pool_.give_back(std::move(b)); }

 protected:
  PARM_COMMUNICATOR_OPS(override)

 private:
  // The request of a staged operation: completes the host request, then copies `result`
  // bytes of host staging back to `device_dst` and returns the buffers.
  RequestPtr finish(RequestPtr host_req, void* device_dst, const void* host_src,
                    size_t result_bytes, Buffer a, Buffer b);
  template <typename Post>
  RequestPtr staged_out_of_place(const void* send, size_t send_bytes, void* recv,
                                 size_t recv_bytes, const Post& post);

  Communicator& host_;
  CopyFn copy_;
  SpaceOfFn space_of_;
  ScratchPool pool_;
};

}  // namespace parm
