// cuBLAS GEMMs with the row-major semantics of parm::cpu::gemm (kernels/cpu/kernels.h), on
// the process's compute stream (kernels/cuda/runtime.h). CUDA builds only; no CUDA headers
// here. All pointers are device memory, contiguous (leading dimension = stored row length).
//
// Precision: C is always fp32 and every product accumulates in fp32 (CUBLAS_COMPUTE_32F).
// kF32: fp32 operands, computed in fp32 without TF32 (cuBLAS may use TF32 only under the
// handle math mode CUBLAS_TF32_TENSOR_OP_MATH, which runtime.cpp never sets), so results
// differ from the CPU oracle by summation order only. kBf16: bf16 operands (uint16_t, the
// upper half of an fp32; see expert_math.h), fp32 accumulation and output.
#pragma once

#include <cstdint>
#include <memory>

namespace parm::cuda {

enum class GemmType { kF32, kBf16 };

// C (m, n) = op(A) (m, k) op(B) (k, n)   (accumulate == false: overwrites C)
// C (m, n) += op(A) op(B)                 (accumulate == true)
// A is stored (m, k), or (k, m) when trans_a; B (k, n), or (n, k) when trans_b; a and b are
// float* (kF32) or uint16_t* bf16 (kBf16). m, n or k may be 0 (k == 0: C is zeroed, or left
// as it is when accumulating). Queued on cuda::stream(); does not wait.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          float* c, bool accumulate, GemmType type);

// One product of a group (operands as in gemm()).
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  float* c = nullptr;
};

// Independent products that share transposes, accumulate and type but not sizes (the
// experts of a layer, each with its own row count), in one cuBLAS call where cuBLAS has one:
// cublasGemmGroupedBatchedEx (CUDA >= 12.5) supports fp32 operands with fp32 C, but bf16
// operands only with a bf16 C, so kBf16 products run as one cublasGemmEx each. Products with
// m == 0 or n == 0 are skipped; k == 0 zeroes C (or leaves it, accumulating), as gemm().
// The C matrices must not overlap. Owns the device array of operand pointers that the
// grouped call reads (written by a kernel on the stream, so calls need no host wait) and host
// scratch sized for max_problems: run() allocates nothing.
class GroupedGemm {
 public:
  enum class Mode {
    kAuto,  // the grouped call where supported (kF32 with 2 or more products)
    kLoop,  // one cublasGemmEx per product (tests compare the two; benchmarks may prefer it)
  };
  explicit GroupedGemm(int64_t max_problems);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Queues the `count` products (count <= max_problems) on cuda::stream().
  void run(bool trans_a, bool trans_b, bool accumulate, GemmType type, const GemmProblem* problems,
           int64_t count);

  void set_mode(Mode mode) { mode_ = mode; }
  Mode mode() const { return mode_; }
  // False once cuBLAS refused the grouped call (CUBLAS_STATUS_NOT_SUPPORTED): this object
  // then runs the loop instead.
  bool grouped_supported() const { return grouped_supported_; }
  int64_t max_problems() const { return max_problems_; }

 private:
  int64_t max_problems_;
  Mode mode_ = Mode::kAuto;
  bool grouped_supported_ = true;
  void** device_pointers_ = nullptr;  // (3, max_problems): the A, B and C arrays
  struct Scratch;                     // host arrays of the grouped call (gemm.cpp)
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace parm::cuda
