#include "tensor_pool.h"

#include <dlpack/dlpack.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dlpack_tensor.h"

namespace parm::py_dlpack {
namespace {

// At most this many free buffers of one shape are kept; more are freed. A training step
// holds one output, one input gradient and five parameter gradients per layer and shape.
constexpr size_t kMaxFreePerShape = 4;

class Pool {
 public:
  Tensor take(const Shape& shape, Device device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find({device, shape});
      if (it != free_.end() && !it->second.empty()) {
        Tensor t = std::move(it->second.back());
        it->second.pop_back();
        return t;
      }
    }
    return Tensor(shape, device);
  }
  void give_back(Tensor t) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = free_[{t.device(), t.shape()}];
    if (list.size() < kMaxFreePerShape) list.push_back(std::move(t));
  }
  size_t pooled() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (const auto& [key, list] : free_) n += list.size();
    return n;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<Device, Shape>, std::vector<Tensor>> free_;
};

// Shared with every exported buffer, so that a deleter running late still finds it.
const std::shared_ptr<Pool>& pool() {
  static const auto p = std::make_shared<Pool>();
  return p;
}

struct Exported {
  DLManagedTensor managed{};
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  std::shared_ptr<Pool> owner;
};

void deleter(DLManagedTensor* m) {
  auto* e = static_cast<Exported*>(m->manager_ctx);
  e->owner->give_back(std::move(e->tensor));
  delete e;
}

// A capsule garbage-collected unconsumed (a consumer renames it "used_dltensor" and owns
// the deleter from then on).
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  m->deleter(m);
}

}  // namespace

pybind11::capsule take(const Shape& shape, Device device) {
  auto e = std::make_unique<Exported>();
  e->tensor = pool()->take(shape, device);
  e->owner = pool();
  e->shape = shape;
  e->strides.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) e->strides[i - 1] = e->strides[i] * shape[i];
  DLTensor& t = e->managed.dl_tensor;
  t.data = e->tensor.data();
  t.device = device == Device::kCpu ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, cuda_ordinal()};
  t.ndim = static_cast<int>(shape.size());
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = deleter;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (capsule == nullptr) throw pybind11::error_already_set();
  e.release();  // owned by the capsule, then by its consumer
  return pybind11::reinterpret_steal<pybind11::capsule>(capsule);
}

size_t pooled() { return pool()->pooled(); }

}  // namespace parm::py_dlpack
