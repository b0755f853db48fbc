#include <exception>

#include "parm/comm.h"
#include "parm/error.h"

namespace parm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  PARM_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "allreduce";
    case CommOp::kAllGather: return "allgather";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllToAll: return "alltoall";
    case CommOp::kAllToAllv: return "alltoallv";
    case CommOp::kSend: return "send";
    case CommOp::kRecv: return "recv";
    case CommOp::kBarrier: return "barrier";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kMetadata: return "metadata";
    case CommOp::kNumOps: break;
  }
  return "?";
}

double bus_bytes(CommOp op, int n, double bytes) {
  switch (op) {
    case CommOp::kAllReduce: return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: return (n - 1) * bytes;
    case CommOp::kRecv:
    case CommOp::kBroadcast:
    case CommOp::kAllToAllv:
    case CommOp::kMetadata: return bytes;
    case CommOp::kSend:
    case CommOp::kBarrier:
    case CommOp::kNumOps: return 0.0;
  }
  return 0.0;
}

void wait_all(std::vector<RequestPtr>& requests) {
  std::exception_ptr first;
  for (auto& r : requests) {
    if (!r) continue;
    try {
      r->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  requests.clear();
  if (first) std::rethrow_exception(first);
}

std::vector<double> max_over_ranks(Communicator& c, std::vector<double> values) {
  c.allreduce(values.data(), values.size(), ReduceOp::kMax);
  return values;
}

}  // namespace parm
