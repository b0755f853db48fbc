// The CPU BenchDevice (host memory, the layer's CPU kernels) and the factory.
#include "perfmodel/bench_device.h"

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::perfmodel {
namespace {

class CpuBenchDevice final : public BenchDevice {
 public:
  Device device() const override { return Device::kCpu; }
  nlohmann::json describe() const override { return {{"device", "cpu"}}; }
  void* alloc(size_t bytes) override {
    void* p = std::calloc(bytes > 0 ? bytes : 1, 1);
    PARM_CHECK(p != nullptr, "calibrate: cannot allocate {} bytes of host memory", bytes);
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  // fp32 operands at either precision: the CPU's bf16 products round them inside.
  void upload(void* dst, const float* src, size_t n, Precision) override {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
            float* c, bool acc, Precision p) override {
    const auto* fa = static_cast<const float*>(a);
    const auto* fb = static_cast<const float*>(b);
    if (p == Precision::kBf16)
      cpu::gemm_bf16(ta, tb, m, n, k, fa, fb, c, acc);
    else
      cpu::gemm(ta, tb, m, n, k, fa, fb, c, acc);
  }
  void copy_rows(const float* src, float* dst, int64_t rows, int64_t cols) override {
    // The order is built on the first (untimed, warm-up) call of a row count.
    if (static_cast<int64_t>(order_.size()) != rows) {
      order_.resize(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) order_[static_cast<size_t>(i)] = (i * 7919) % rows;
    }
    cpu::gather_rows(src, cols, order_.data(), rows, dst);
  }
  void bias_gelu(const float* pre, const float* bias, float* act, int64_t rows,
                 int64_t cols) override {
    cpu::bias_gelu(pre, bias, act, rows, cols);
  }
  void sync() override {}

 private:
  std::vector<int64_t> order_;
};

}  // namespace

std::unique_ptr<BenchDevice> make_bench_device(Device d) {
  check_device(d);
  if (d == Device::kCpu) return std::make_unique<CpuBenchDevice>();
#ifdef PARM_HAVE_CUDA
  return make_cuda_bench_device();
#else
  PARM_CONFIG_CHECK(false, "calibrate --device {}: not available in this build", device_name(d));
  return nullptr;
#endif
}

}  // namespace parm::perfmodel
