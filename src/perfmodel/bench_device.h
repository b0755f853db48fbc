// What calibrate measures on a device, behind a small interface so that perfmodel needs no
// device code of its own: buffers, the products (row-major, parm::cpu::gemm semantics), the
// memory-bound kernels and a wait for queued work. The CPU one runs the layer's CPU kernels
// on host memory; the CUDA one (perfmodel/cuda/, CUDA builds only) runs cuBLAS and the
// layer's CUDA kernels on the process's compute stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "parm/device.h"

namespace parm::perfmodel {

class BenchDevice {
 public:
  virtual ~BenchDevice() = default;
  virtual Device device() const = 0;
  // Device, GPU model, memory... recorded in the profile's "machine".
  virtual nlohmann::json describe() const = 0;

  // `bytes` of zero-filled memory in the device's space (what comm(g) of a topology on
  // device() moves); freed by release().
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // dst (n values at precision p: fp32, or bf16 as uint16_t) = src (host, n floats).
  virtual void upload(void* dst, const float* src, size_t n, Precision p) = 0;

  // c (m, n) = op(a) op(b) (+ c when accumulate), fp32 c; a and b at precision p (bf16:
  // fp32 accumulation; the CPU rounds fp32 operands to bf16 inside, as its layer does).
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                    const void* b, float* c, bool accumulate, Precision p) = 0;
  // dst = the rows of src (rows x cols floats) in a scattered order (the dispatch's and the
  // layout gathers' row copies).
  virtual void copy_rows(const float* src, float* dst, int64_t rows, int64_t cols) = 0;
  // act = gelu(pre + bias) over rows x cols (bias: cols floats).
  virtual void bias_gelu(const float* pre, const float* bias, float* act, int64_t rows,
                         int64_t cols) = 0;
  // Returns when everything queued above is done (a timer around a call and sync() times
  // the work, not its launch).
  virtual void sync() = 0;
};

// The device calibrate measures. Throws parm::InvalidConfig before any work where this
// build or machine cannot run `d` (check_device: cuda in a CPU-only build, or no GPU).
std::unique_ptr<BenchDevice> make_bench_device(Device d);

// A buffer of a BenchDevice, released when it goes out of scope.
class BenchBuffer {
 public:
  BenchBuffer(BenchDevice& dev, size_t bytes) : dev_(&dev), p_(dev.alloc(bytes)) {}
  ~BenchBuffer() { dev_->release(p_); }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  float* f() const { return static_cast<float*>(p_); }
  void* get() const { return p_; }

 private:
  BenchDevice* dev_;
  void* p_;
};

#ifdef PARM_HAVE_CUDA
std::unique_ptr<BenchDevice> make_cuda_bench_device();  // perfmodel/cuda/bench_device_cuda.cpp
#endif

}  // namespace parm::perfmodel
