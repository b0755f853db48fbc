// The checked entry points of parm::Communicator: each checks its buffers against the
// communicator's memory space, then calls the backend.
#include <algorithm>

#include "parm/comm.h"
#include "parm/error.h"

namespace parm {
namespace {

// Elements spanned by a variable layout: max over peers of displacement + count.
size_t span_of(const size_t* counts, const size_t* displs, int n) {
  size_t end = 0;
  for (int p = 0; p < n; ++p) end = std::max(end, displs[p] + counts[p]);
  return end;
}

}  // namespace

void Communicator::check_buffer(const char* op, const char* which, const void* p,
                                size_t bytes) const {
  if (bytes == 0) return;
  const MemorySpace want = memory_space();
  const MemorySpace got = space_of(p);
  if (got == want) return;
  throw Error(fmt::format(
      "rank {} (group {} rank {} of {}): {} was handed a {} buffer `{}` ({} bytes at {}) but "
      "the {} communicator moves {} memory only{}",
      world_rank(), name(), rank(), size(), op, memory_space_name(got), which, bytes, p,
      backend(), memory_space_name(want),
      want == MemorySpace::kHost ? "; device buffers go to Topology::comm(g) on a cuda run"
                                 : "; host buffers go to Topology::host_comm(g)"));
}

RequestPtr Communicator::iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  check_buffer("allreduce", "buf", buf, count * dtype_size(dtype));
  return do_iallreduce(buf, count, dtype, op);
}

RequestPtr Communicator::iallgather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  check_buffer("allgather", "send", send, bytes);
  check_buffer("allgather", "recv", recv, bytes * static_cast<size_t>(size()));
  return do_iallgather(send, recv, count, dtype);
}

RequestPtr Communicator::ireduce_scatter(const void* send, void* recv, size_t count,
                                         DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  check_buffer("reduce_scatter", "send", send, bytes * static_cast<size_t>(size()));
  check_buffer("reduce_scatter", "recv", recv, bytes);
  return do_ireduce_scatter(send, recv, count, dtype);
}

RequestPtr Communicator::ialltoall(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype) * static_cast<size_t>(size());
  check_buffer("alltoall", "send", send, bytes);
  check_buffer("alltoall", "recv", recv, bytes);
  return do_ialltoall(send, recv, count, dtype);
}

RequestPtr Communicator::ialltoallv(const void* send, const size_t* send_counts,
                                    const size_t* send_displs, void* recv,
                                    const size_t* recv_counts, const size_t* recv_displs,
                                    DType dtype) {
  const size_t es = dtype_size(dtype);
  check_buffer("alltoallv", "send", send, span_of(send_counts, send_displs, size()) * es);
  check_buffer("alltoallv", "recv", recv, span_of(recv_counts, recv_displs, size()) * es);
  return do_ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
}

RequestPtr Communicator::isend(const void* buf, size_t count, DType dtype, int peer, int tag) {
  check_buffer("send", "buf", buf, count * dtype_size(dtype));
  return do_isend(buf, count, dtype, peer, tag, /*counted=*/true);
}

RequestPtr Communicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  check_buffer("recv", "buf", buf, count * dtype_size(dtype));
  return do_irecv(buf, count, dtype, peer, tag, /*counted=*/true);
}

RequestPtr Communicator::isend_uncounted(const void* buf, size_t count, DType dtype, int peer,
                                         int tag) {
  check_buffer("send", "buf", buf, count * dtype_size(dtype));
  return do_isend(buf, count, dtype, peer, tag, /*counted=*/false);
}

RequestPtr Communicator::irecv_uncounted(void* buf, size_t count, DType dtype, int peer,
                                         int tag) {
  check_buffer("recv", "buf", buf, count * dtype_size(dtype));
  return do_irecv(buf, count, dtype, peer, tag, /*counted=*/false);
}

RequestPtr Communicator::ibroadcast(void* buf, size_t count, DType dtype, int root) {
  check_buffer("broadcast", "buf", buf, count * dtype_size(dtype));
  return do_ibroadcast(buf, count, dtype, root);
}

}  // namespace parm
