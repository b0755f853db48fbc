#include "torch_group.h"

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <utility>

#include "comm/external_communicator.h"
#include "parm/device.h"
#include "parm/error.h"

namespace py = pybind11;

namespace parm::py_torch {
namespace {

// A DLPack capsule over `count` elements of `dtype` at `p`, borrowed: torch's tensor of it
// reads and writes that memory in place and frees only the capsule's own struct.
struct Borrowed {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
};

void free_borrowed(DLManagedTensor* m) { delete static_cast<Borrowed*>(m->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed: torch calls the deleter
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  m->deleter(m);
}

DLDataType dl_type(DType d) {
  switch (d) {
    case DType::kF32: return {kDLFloat, 32, 1};
    case DType::kF64: return {kDLFloat, 64, 1};
    case DType::kI32: return {kDLInt, 32, 1};
    case DType::kI64: return {kDLInt, 64, 1};
    case DType::kU8: return {kDLUInt, 8, 1};
  }
  throw Error("unknown dtype");
}

py::object borrow(const void* p, size_t count, DType dtype) {
  auto b = std::make_unique<Borrowed>();
  // A tensor of no elements still needs an address; torch never reads it.
  static char empty_placeholder[8];
  b->managed.dl_tensor.data = p != nullptr ? const_cast<void*>(p) : empty_placeholder;
  b->managed.dl_tensor.device = {kDLCPU, 0};
  b->managed.dl_tensor.ndim = 1;
  b->managed.dl_tensor.dtype = dl_type(dtype);
  b->shape[0] = static_cast<int64_t>(count);
  b->managed.dl_tensor.shape = b->shape;
  b->managed.dl_tensor.strides = nullptr;
  b->managed.manager_ctx = b.get();
  b->managed.deleter = free_borrowed;
  PyObject* capsule = PyCapsule_New(&b->managed, "dltensor", capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  (void)b.release();
  return py::reinterpret_steal<py::object>(capsule);
}

const char* op_name(ReduceOp op) {
  return op == ReduceOp::kMax ? "max" : op == ReduceOp::kMin ? "min" : "sum";
}

// Runs f (which calls into Python) with the GIL; a Python exception becomes CommError (the
// library failed), with its message.
template <typename F>
auto in_python(const char* what, F&& f) {
  py::gil_scoped_acquire gil;
  try {
    return f();
  } catch (py::error_already_set& e) {
    throw CommError(fmt::format("torch.distributed {}: {}", what, e.what()));
  }
}

// A parm._torch_backend.Work: done() and wait(seconds) -> bool.
class PyWork final : public ExternalWork {
 public:
  explicit PyWork(py::object work) : work_(std::move(work)) {}
  ~PyWork() override {
    py::gil_scoped_acquire gil;
    work_ = py::object();
  }
  bool poll() override {
    return in_python("work", [&] { return work_.attr("done")().cast<bool>(); });
  }
  bool wait_for(double seconds) override {
    return in_python("work", [&] { return work_.attr("wait")(seconds).cast<bool>(); });
  }

 private:
  py::object work_;
};

class PyGroup final : public ExternalGroup {
 public:
  explicit PyGroup(py::object group) : group_(std::move(group)) {
    rank_ = group_.attr("rank").cast<int>();
    size_ = group_.attr("size").cast<int>();
  }
  ~PyGroup() override {
    py::gil_scoped_acquire gil;
    group_ = py::object();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  ExternalWorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    return call("allreduce", [&] {
      return group_.attr("allreduce")(borrow(buf, count, dtype), op_name(op));
    });
  }
  ExternalWorkPtr allgather(const void* send, void* recv, size_t count, DType dtype) override {
    return call("allgather", [&] {
      return group_.attr("allgather")(borrow(send, count, dtype),
                                      borrow(recv, count * size_, dtype));
    });
  }
  ExternalWorkPtr alltoall(const void* send, void* recv, size_t count, DType dtype) override {
    return call("alltoall", [&] {
      return group_.attr("alltoall")(borrow(send, count * size_, dtype),
                                     borrow(recv, count * size_, dtype));
    });
  }
  ExternalWorkPtr alltoallv(const void* send, const size_t* send_counts,
                            const size_t* send_displs, void* recv, const size_t* recv_counts,
                            const size_t* recv_displs, DType dtype) override {
    size_t send_span = 0, recv_span = 0;
    std::vector<size_t> sc, sd, rc, rd;
    for (int p = 0; p < size_; ++p) {
      sc.push_back(send_counts[p]);
      sd.push_back(send_displs[p]);
      rc.push_back(recv_counts[p]);
      rd.push_back(recv_displs[p]);
      send_span = std::max(send_span, send_displs[p] + send_counts[p]);
      recv_span = std::max(recv_span, recv_displs[p] + recv_counts[p]);
    }
    return call("alltoallv", [&] {
      return group_.attr("alltoallv")(borrow(send, send_span, dtype), sc, sd,
                                      borrow(recv, recv_span, dtype), rc, rd);
    });
  }
  ExternalWorkPtr send(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    return call("send", [&] {
      return group_.attr("send")(borrow(buf, count, dtype), peer, tag);
    });
  }
  ExternalWorkPtr recv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    return call("recv", [&] {
      return group_.attr("recv")(borrow(buf, count, dtype), peer, tag);
    });
  }
  ExternalWorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    return call("broadcast", [&] {
      return group_.attr("broadcast")(borrow(buf, count, dtype), root);
    });
  }
  ExternalWorkPtr barrier() override {
    return call("barrier", [&] { return group_.attr("barrier")(); });
  }

 private:
  template <typename F>
  ExternalWorkPtr call(const char* what, F&& f) {
    return in_python(what, [&] { return std::make_unique<PyWork>(f()); });
  }

  py::object group_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Topology> adopt(int world, int mp, int ep, int esp, int pp,
                                const std::string& order, double timeout_s, int world_rank,
                                const std::vector<int>& node_of_rank, const py::dict& groups,
                                const std::string& device) {
  PARM_CONFIG_CHECK(timeout_s > 0, "timeout {} s must be positive", timeout_s);
  const Device dev = parse_device(device);
  if (dev == Device::kCuda) check_device(dev);
  // A cuda run's host communicators refuse device pointers (they go to the NCCL ones).
  const SpaceOfFn space = dev == Device::kCuda ? &cuda_space_of : &host_space_of;
  const Layout layout = make_layout(world, mp, ep, esp, pp, order);
  std::array<std::unique_ptr<Communicator>, kNumGroups> comms;
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    const char* name = group_name(g);
    PARM_CONFIG_CHECK(groups.contains(name), "parm.init(backend='torch'): no group {}", name);
    comms[static_cast<size_t>(gi)] = std::make_unique<ExternalCommunicator>(
        std::make_unique<PyGroup>(py::reinterpret_borrow<py::object>(groups[name])), name,
        world_rank, group_is_intra_node(layout, g, world_rank, node_of_rank), timeout_s,
        "torch", space);
  }
  return Topology::adopt(layout, world_rank, node_of_rank, std::move(comms), dev);
}

}  // namespace parm::py_torch
