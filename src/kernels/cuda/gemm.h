// cuBLAS GEMMs with the row-major semantics of parm::cpu::gemm (kernels/cpu/kernels.h), on
// the process's compute stream (kernels/cuda/runtime.h). CUDA builds only; no CUDA headers
// here. All pointers are device memory, contiguous (leading dimension = stored row length).
//
// Precision: every product accumulates in fp32 (CUBLAS_COMPUTE_32F).
// kF32: fp32 operands and C, computed in fp32 without TF32 (cuBLAS may use TF32 only under the
// handle math mode CUBLAS_TF32_TENSOR_OP_MATH, which runtime.cpp never sets), so results
// differ from the CPU oracle by summation order only. kBf16: bf16 operands (uint16_t, the
// upper half of an fp32; see expert_math.h), fp32 C. kBf16ToBf16: bf16 operands and a bf16 C
// (the fp32 sum rounded once, to nearest even).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cuda/gemm_args.h"

namespace parm::cuda {

enum class GemmType { kF32, kBf16, kBf16ToBf16 };
inline constexpr int kNumGemmTypes = 3;
// Bytes of one element of C.
inline size_t output_bytes(GemmType t) { return t == GemmType::kBf16ToBf16 ? 2 : 4; }

// C (m, n) = op(A) (m, k) op(B) (k, n)   (accumulate == false: overwrites C)
// C (m, n) += op(A) op(B)                 (accumulate == true)
// A is stored (m, k), or (k, m) when trans_a; B (k, n), or (n, k) when trans_b; a and b are
// float* (kF32) or uint16_t* bf16 (kBf16, kBf16ToBf16); c is float* except at kBf16ToBf16
// (uint16_t*). m, n or k may be 0 (k == 0: C is zeroed, or left as it is when accumulating).
// Queued on cuda::stream(); does not wait.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          void* c, bool accumulate, GemmType type);

// Independent products that share transposes, accumulate and type but not sizes (the
// experts of a layer, each with its own row count), in one cublasGemmGroupedBatchedEx call
// (CUDA >= 12.5), products of equal sizes in one group of it (gemm_args.h). Its documented
// types are fp32 -> fp32 and bf16 -> bf16 (kF32, kBf16ToBf16); kBf16 (bf16 -> fp32 C, the
// weight gradients) is tried once and, where cuBLAS refuses it, runs as one cublasGemmEx per
// product from then on. Products with m == 0 or n == 0 are skipped; k == 0 zeroes C (or
// leaves it, accumulating), as gemm(). The C matrices must not overlap. Owns the device array
// of operand pointers that the grouped call reads (written by a kernel on the stream, so
// calls need no host wait) and host scratch sized for max_problems: run() allocates nothing.
class GroupedGemm {
 public:
  enum class Mode {
    kAuto,  // the grouped call where supported (2 or more products)
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
  // False once cuBLAS refused the grouped call at this type (CUBLAS_STATUS_NOT_SUPPORTED, or
  // INVALID_VALUE at kBf16, whose types the grouped call does not document): this object then
  // runs the loop at that type instead.
  bool grouped_supported(GemmType t) const { return grouped_supported_[static_cast<int>(t)]; }
  // Groups of the last grouped call (0 when the last run() looped or had nothing to do).
  int64_t last_groups() const { return last_groups_; }
  int64_t max_problems() const { return max_problems_; }

 private:
  int64_t max_problems_;
  Mode mode_ = Mode::kAuto;
  bool grouped_supported_[kNumGemmTypes] = {true, true, true};
  int64_t last_groups_ = 0;
  void** device_pointers_ = nullptr;  // (3, max_problems): the A, B and C arrays
  struct Scratch;                     // host arrays of the grouped call (gemm.cpp)
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace parm::cuda
