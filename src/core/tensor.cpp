#include "parm/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/ranges.h>

#include "parm/error.h"
#include "parm/memory.h"

namespace parm {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    PARM_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    n *= d;
  }
  return n;
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  constexpr size_t kAlign = 64;
  size_t bytes = static_cast<size_t>(std::max<int64_t>(numel_, 1)) * sizeof(float);
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
  PARM_CHECK(p != nullptr, "out of memory allocating tensor {} ({} bytes)", shape_str(shape_),
             bytes);
  std::memset(p, 0, bytes);
  // Counted (the tensor's bytes; not the alignment padding) under this thread's memory kind
  // until freed.
  const MemoryKind kind = current_memory_kind();
  const int64_t counted = this->bytes();
  count_tensor_bytes(false, kind, counted);
  storage_ = std::shared_ptr<float>(p, [kind, counted](float* q) {
    count_tensor_bytes(false, kind, -counted);
    std::free(q);
  });
  data_ = p;
}

Tensor::Tensor(Shape shape, Device device) {
  if (device == Device::kCpu) {
    *this = Tensor(std::move(shape));
    return;
  }
  shape_ = std::move(shape);
  numel_ = shape_numel(shape_);
  device_ = device;
  auto* p = static_cast<float*>(device_alloc(static_cast<size_t>(bytes())));
  const MemoryKind kind = current_memory_kind();
  const int64_t counted = bytes();
  count_tensor_bytes(true, kind, counted);
  storage_ = std::shared_ptr<float>(p, [kind, counted](float* q) {
    count_tensor_bytes(true, kind, -counted);
    device_free(q);
  });
  data_ = p;
}

Tensor Tensor::view(float* data, Shape shape, Device device) {
  Tensor t;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  PARM_CHECK(data != nullptr || t.numel_ == 0, "view of null data with shape {}",
             shape_str(t.shape_));
  t.data_ = data;
  return t;
}

int64_t Tensor::dim(int i) const {
  PARM_CHECK(i >= 0 && i < ndim(), "dim {} of a {}-d tensor {}", i, ndim(), shape_str(shape_));
  return shape_[i];
}

int64_t Tensor::rows() const { return shape_.empty() ? 1 : (shape_.size() == 1 ? 1 : shape_[0]); }

int64_t Tensor::cols() const {
  const int64_t r = rows();
  return r == 0 ? 0 : numel_ / r;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  PARM_CHECK(ndim() >= 1, "slice_rows of a 0-d tensor");
  PARM_CHECK(0 <= begin && begin <= end && end <= shape_[0],
             "slice_rows [{}, {}) of tensor {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  const int64_t inner = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.shape_[0] = end - begin;
  t.numel_ = (end - begin) * inner;
  t.data_ = data_ + begin * inner;
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  PARM_CHECK_EQ(shape_numel(shape), numel_);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to(Device device) const {
  Tensor t(shape_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float value) {
  if (value == 0.0f) {
    zero();
    return;
  }
  PARM_CHECK(on_host(), "fill({}) of a {} tensor {} (host only; zero() works anywhere)", value,
             device_name(device_), shape_str(shape_));
  std::fill(data_, data_ + numel_, value);
}

void Tensor::zero() {
  if (on_host())
    std::fill(data_, data_ + numel_, 0.0f);
  else
    device_zero(data_, static_cast<size_t>(bytes()));
}

void Tensor::copy_from(const Tensor& src) {
  PARM_CHECK(src.numel_ == numel_, "copy_from {} into {}", shape_str(src.shape_),
             shape_str(shape_));
  if (numel_ == 0 || src.data_ == data_) return;
  if (on_host() && src.on_host())
    std::memmove(data_, src.data_, static_cast<size_t>(bytes()));
  else
    device_copy(data_, src.data_, static_cast<size_t>(bytes()));
}

ErrorStats compare(const Tensor& a, const Tensor& b, double rel_floor) {
  PARM_CHECK(a.numel() == b.numel(), "compare {} with {}", shape_str(a.shape()),
             shape_str(b.shape()));
  PARM_CHECK(a.on_host() && b.on_host(), "compare() of device tensors: copy them to the host");
  ErrorStats s;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return {INFINITY, INFINITY};
    s.max_abs = std::max(s.max_abs, d);
    s.max_rel = std::max(s.max_rel, d / std::max<double>(std::fabs(b[i]), rel_floor));
  }
  return s;
}

}  // namespace parm
