// A small dense fp32 tensor: contiguous rows, row-major, owned (shared storage, 64-byte
// aligned) or a view of memory someone else owns. Copying a Tensor shares its storage, as
// a view does; `clone()` makes an independent copy.
//
// A tensor lives on the CPU (default) or on the GPU (Device::kCuda, CUDA builds). The host
// never dereferences device data: data() is then a device pointer for kernels and
// communicators; element access, fill with a non-zero value and compare() are host-only;
// zero(), copy_from() (any direction), clone() and to() work on both.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "parm/device.h"

namespace parm {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Owned, zero-filled.
  explicit Tensor(Shape shape);
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  // Owned, zero-filled, on `device`.
  Tensor(Shape shape, Device device);

  // A view of `data` (not owned; the caller keeps it alive).
  static Tensor view(float* data, Shape shape, Device device = Device::kCpu);

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }
  // Leading dimension and the product of the others (a 1-D tensor is one row).
  int64_t rows() const;
  int64_t cols() const;
  bool empty() const { return numel_ == 0; }
  bool owns() const { return storage_ != nullptr; }
  Device device() const { return device_; }
  bool on_host() const { return device_ == Device::kCpu; }

  float* data() { return data_; }
  const float* data() const { return data_; }
  float* row(int64_t r) { return data_ + r * cols(); }
  const float* row(int64_t r) const { return data_ + r * cols(); }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  float& at(int64_t r, int64_t c) { return data_[r * cols() + c]; }
  float at(int64_t r, int64_t c) const { return data_[r * cols() + c]; }

  // View of rows [begin, end) of the leading dimension (shares storage).
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same storage, new shape of the same numel.
  Tensor reshaped(Shape shape) const;
  Tensor clone() const;
  // An independent copy on `device` (a clone when it is already there).
  Tensor to(Device device) const;

  void fill(float value);  // host only (zero() works anywhere)
  void zero();
  void copy_from(const Tensor& src);  // same numel, any devices; overwrites

 private:
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<float> storage_;  // null for views
  float* data_ = nullptr;
  Device device_ = Device::kCpu;
};

// Largest |a-b| and largest |a-b| / max(|b|, floor) over all elements; same numel required
// (host tensors).
struct ErrorStats {
  double max_abs = 0.0;
  double max_rel = 0.0;
};
ErrorStats compare(const Tensor& a, const Tensor& b, double rel_floor = 1e-3);

}  // namespace parm
