// The CUDA BenchDevice: cuBLAS products and the layer's CUDA kernels on the process's compute
// stream (kernels/cuda/runtime.h), device memory from parm::device_alloc.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"
#include "perfmodel/bench_device.h"

namespace parm::perfmodel {
namespace {

class CudaBenchDevice final : public BenchDevice {
 public:
  Device device() const override { return Device::kCuda; }
  nlohmann::json describe() const override {
    const cuda::Context& ctx = cuda::context();
    cudaDeviceProp prop{};
    PARM_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.device));
    int runtime = 0, cublas = 0;
    PARM_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    PARM_CUBLAS_CHECK(cublasGetVersion(ctx.cublas, &cublas));
    return {{"device", "cuda"},
            {"gpu", prop.name},
            {"gpu_index", ctx.device},
            {"gpu_memory_bytes", static_cast<int64_t>(prop.totalGlobalMem)},
            {"sm_count", prop.multiProcessorCount},
            {"compute_capability", fmt::format("{}.{}", prop.major, prop.minor)},
            {"cuda_runtime", runtime},
            {"cublas", cublas}};
  }
  void* alloc(size_t bytes) override { return device_alloc(bytes > 0 ? bytes : 1); }
  void release(void* p) noexcept override {
    try {
      device_free(p);
    } catch (...) {
      // A failed free during unwinding: the error that unwinds is the one to report.
    }
  }
  void upload(void* dst, const float* src, size_t n, Precision p) override {
    if (p == Precision::kFp32) {
      device_copy(dst, src, n * sizeof(float));
      return;
    }
    void* staging = device_alloc(n * sizeof(float));
    device_copy(staging, src, n * sizeof(float));
    cuda::to_bf16(static_cast<const float*>(staging), static_cast<uint16_t*>(dst),
                  static_cast<int64_t>(n));
    device_sync();
    device_free(staging);
  }
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
            float* c, bool acc, Precision p) override {
    cuda::gemm(ta, tb, m, n, k, a, b, c, acc,
               p == Precision::kBf16 ? cuda::GemmType::kBf16 : cuda::GemmType::kF32);
  }
  // A contiguous device-to-device copy: the GPU layer's row moves are coalesced copies of
  // whole rows (copy_segments), whose rate this is.
  void copy_rows(const float* src, float* dst, int64_t rows, int64_t cols) override {
    PARM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(rows * cols) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, cuda::stream()));
  }
  void bias_gelu(const float* pre, const float* bias, float* act, int64_t rows,
                 int64_t cols) override {
    const cuda::ExpertRows r{&rows, 1, rows * cols, cols};
    cuda::bias_gelu(cuda::f32_values(pre), bias, act, nullptr, r);
  }
  void sync() override { PARM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream())); }
};

}  // namespace

std::unique_ptr<BenchDevice> make_cuda_bench_device() {
  return std::make_unique<CudaBenchDevice>();
}

}  // namespace parm::perfmodel
