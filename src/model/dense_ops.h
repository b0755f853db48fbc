// The dense ops of the model and its optimizer, as one table per device, chosen once from the
// device the model's tensors live on:
//   CPU  (model/dense_ops.cpp): today's kernels (model/blocks.h, kernels/cpu/kernels.h), the
//        oracle; calling an op through the table gives the same bits as calling it directly.
//   CUDA (model/cuda/dense_ops_cuda.cpp, CUDA builds only): the parm::cuda kernels
//        (kernels/cuda/dense_kernels.h), queued on the process's compute stream.
// Every pointer an op takes is memory of the table's device, except where a comment says
// host. Each op has the contract of the CPU function of the same name (shapes, overwrite or
// accumulate); the CPU functions' own argument checks (a token or target outside the
// vocabulary) are the caller's on a device, before the indices are copied there
// (check_token_range).
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>

#include "model/blocks.h"
#include "parm/device.h"
#include "parm/error.h"

namespace parm::model {

// One AdamW update of one parameter (train/optimizer.h: OptimConfig, lr_at, the clip).
struct AdamWStep {
  double lr = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;          // counts from 1 (bias correction)
  double grad_scale = 1.0;   // gradients are multiplied by it first (clipping)
  bool decay = true;         // the parameter decays (matrices yes, biases and gains no)
};

struct DenseOps {
  Device device = Device::kCpu;

  // ---- model/blocks.h -----------------------------------------------------------------
  void (*linear_forward)(const float* x, const float* w, const float* b, float* y, int64_t rows,
                         int64_t in, int64_t out, Precision p);
  void (*linear_backward)(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx,
                          Precision p);
  // dense_gemm, contiguous form.
  void (*gemm)(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const float* a, const float* b, float* c, bool accumulate);
  // tokens: memory of this device. wte (dwte) holds rows [vocab_begin, vocab_end) of the
  // whole table (model/blocks.h; model/vocab_parallel.h).
  void (*embedding_forward)(const int32_t* tokens, const float* wte, const float* wpe,
                            float* out, int64_t batch, int64_t seq_len, int64_t model_dim,
                            int64_t vocab, int64_t vocab_begin, int64_t vocab_end);
  void (*embedding_backward)(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                             int64_t batch, int64_t seq_len, int64_t model_dim,
                             int64_t vocab_begin, int64_t vocab_end);
  void (*attention_forward)(const AttentionShape& s, const float* q, const float* k,
                            const float* v, float* probs, float* out);
  // dscores: attention_scratch(s) floats.
  void (*attention_backward)(const AttentionShape& s, const float* q, const float* k,
                             const float* v, const float* probs, const float* dout, float* dq,
                             float* dk, float* dv, float* dscores);
  int64_t (*attention_scratch)(const AttentionShape& s);
  // targets: memory of this device. The loss sum comes back to the host (a device waits).
  double (*cross_entropy)(const float* logits, const int32_t* targets, float* dlogits,
                          int64_t n, int64_t vocab, float scale);
  // The vocabulary-parallel cross-entropy's three passes (cpu::ce_row_max, ce_row_sums,
  // ce_finish in kernels/cpu/kernels.h; model/vocab_parallel.h reduces between them): every
  // pointer memory of this device; ce_finish's loss sum comes back to the host (a device
  // waits). targets: ids within this rank's columns, -1 where another rank holds the target.
  void (*ce_row_max)(const float* logits, int64_t n, int64_t cols, float* row_max);
  void (*ce_row_sums)(const float* logits, const float* row_max, const int32_t* targets,
                      int64_t n, int64_t cols, double* stats);
  double (*ce_finish)(const float* logits, const float* row_max, const double* stats,
                      const int32_t* targets, float* dlogits, int64_t n, int64_t cols,
                      float scale);

  // ---- kernels/cpu/kernels.h ------------------------------------------------------------
  void (*layernorm_forward)(const float* x, const float* gamma, const float* beta, float* y,
                            float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
  void (*layernorm_backward)(const float* dy, const float* x, const float* gamma,
                             const float* mean, const float* rstd, float* dx, float* dgamma,
                             float* dbeta, int64_t rows, int64_t cols);
  // layernorm_backward adding its input gradient into dx (+=, a residual stream's gradient;
  // dx must not alias dy): the bits of layernorm_backward then add. Null on tables without it
  // (the caller runs those two).
  void (*layernorm_backward_add)(const float* dy, const float* x, const float* gamma,
                                 const float* mean, const float* rstd, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t cols) = nullptr;
  void (*bias_gelu_forward)(float* pre, const float* bias, float* act, int64_t rows,
                            int64_t cols);
  void (*gelu_backward)(const float* x, const float* dy, float* dx, int64_t n);
  void (*add_bias)(float* y, const float* bias, int64_t rows, int64_t cols);
  void (*bias_backward)(const float* dy, float* dbias, int64_t rows, int64_t cols);
  // idx: memory of this device.
  void (*gather_rows)(const float* src, int64_t cols, const int64_t* idx, int64_t n, float* dst);
  void (*scatter_add_rows)(const float* src, int64_t cols, const int64_t* idx,
                           const float* scale, int64_t n, float* dst);

  // ---- elementwise and the optimizer --------------------------------------------------
  // out (n) = a + b, element by element in fp32; out may alias a or b.
  void (*add)(const float* a, const float* b, float* out, int64_t n);
  // dst (n) = src (n), both memory of this device; they do not overlap.
  void (*copy)(float* dst, const float* src, int64_t n);
  // acc + the sum over the `count` buffers, in order, of the squares of their elements,
  // in double (the CPU sums each buffer in 32 partial sums, cpu::sum_of_squares, and adds
  // the buffers' sums to acc in order). Host result.
  double (*sum_of_squares)(const float* const* bufs, const int64_t* sizes, int64_t count,
                           double acc);
  // AdamW over n elements, in fp32 with the scalars derived in double: g' = g * grad_scale;
  // m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2; w = w * (1 - lr * weight_decay, when
  // decay) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Overwrites w, m, v.
  void (*adamw)(const AdamWStep& s, float* w, const float* g, float* m, float* v, int64_t n);

  // ---- bf16 weights packed once per step (model/bf16_weights.h) ------------------------
  // Tables whose bf16 products read packed weights (the CPU's) set these; the others leave
  // them null and run their bf16 products and GeLU through the ops above.
  // cpu::bf16_packed_b_size: values of a packed B (k, n).
  int64_t (*bf16_packed_b_size)(int64_t k, int64_t n) = nullptr;
  // cpu::bf16_pack_b_both: w (rows, cols) as packed B of w and of w^T.
  void (*bf16_pack_b_both)(int64_t rows, int64_t cols, const float* w, uint16_t* packed,
                           uint16_t* packed_t) = nullptr;
  // cpu::gemm_bf16_packed_b, contiguous: C (m, n) (+)= op(A) (m, k) B, B packed (k, n).
  void (*gemm_bf16_packed_b)(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
                             const uint16_t* packed_b, float* c, bool accumulate) = nullptr;
  // An activation that serves several products (LN1's output: Q, K and V) packed once:
  // cpu::bf16_packed_a_size / bf16_pack_a of op(A) (m, k), contiguous (stored (k, m) when
  // trans); cpu::bf16_pack_b of B (k, n), contiguous; cpu::gemm_bf16_packed, C (m, n)
  // contiguous. pack + gemm_bf16_packed gives the bits of gemm_bf16_packed_b.
  int64_t (*bf16_packed_a_size)(int64_t m, int64_t k) = nullptr;
  void (*bf16_pack_a)(bool trans, int64_t m, int64_t k, const float* a,
                      uint16_t* packed) = nullptr;
  void (*bf16_pack_b)(int64_t k, int64_t n, const float* b, uint16_t* packed) = nullptr;
  void (*gemm_bf16_packed)(int64_t m, int64_t n, int64_t k, const uint16_t* packed_a,
                           const uint16_t* packed_b, float* c, bool accumulate) = nullptr;
  // The dense MLP's GeLU at bf16 (cpu::bias_gelu_bf16 / bias_gelu_backward_bf16): act =
  // gelu(x + bias), x left as it is; dx = gelu'(x + bias) dact (may alias dact), dbias +=.
  void (*bias_gelu_bf16)(const float* x, const float* bias, float* act, int64_t rows,
                         int64_t cols) = nullptr;
  void (*bias_gelu_backward_bf16)(const float* x, const float* bias, const float* dact,
                                  float* dx, float* dbias, int64_t rows, int64_t cols) = nullptr;
  // The same two with their output also rounded into packed A (bf16_packed_a_size(rows,
  // cols) values at `packed`): the bits of the two above followed by bf16_pack_a (cpu::
  // bias_gelu_pack_a_bf16 / bias_gelu_backward_pack_a_bf16), in one pass. Set where the two
  // above and the packs are.
  void (*bias_gelu_pack_a_bf16)(const float* x, const float* bias, float* act, int64_t rows,
                                int64_t cols, uint16_t* packed) = nullptr;
  void (*bias_gelu_backward_pack_a_bf16)(const float* x, const float* bias, const float* dact,
                                         float* dx, float* dbias, int64_t rows, int64_t cols,
                                         uint16_t* packed) = nullptr;

  // ---- raw memory of this device ------------------------------------------------------
  void* (*alloc_bytes)(size_t bytes);  // zero-filled
  void (*free_bytes)(void* p);
  // dst (memory of this device) = src (host), `bytes` bytes; src may be reused on return.
  void (*upload)(void* dst, const void* src, size_t bytes);
};

// `capacity` values of T in the memory of ops.device, filled from the host (the token ids,
// targets and row indices a step's batch brings).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DenseOps& ops, int64_t capacity)
      : ops_(&ops),
        capacity_(capacity),
        mem_(ops.alloc_bytes(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(T)),
             ops.free_bytes) {}
  // Copies host[0, n) in (n <= capacity) and returns the copy.
  const T* upload(const T* host, int64_t n) {
    PARM_CHECK(n >= 0 && n <= capacity_, "{} values into a device array of {}", n, capacity_);
    if (n > 0) ops_->upload(mem_.get(), host, static_cast<size_t>(n) * sizeof(T));
    return data();
  }
  const T* data() const { return static_cast<const T*>(mem_.get()); }
  // The memory itself, for a device op to write (the vocabulary-parallel loss's row numbers).
  T* data() { return static_cast<T*>(mem_.get()); }

 private:
  const DenseOps* ops_ = nullptr;
  int64_t capacity_ = 0;
  std::shared_ptr<void> mem_;
};

// The table of `device`. Throws InvalidConfig for cuda in a build without CUDA.
const DenseOps& dense_ops(Device device);

// Refuses, on the host, a token outside [0, vocab) (the message names its position), as
// embedding_forward does on the CPU: the check a device table leaves to its caller.
void check_token_range(const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t vocab);

}  // namespace parm::model
