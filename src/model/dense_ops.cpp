// The CPU table: today's kernels, unchanged (the oracle the CUDA table is checked against).
#include "model/dense_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"

#ifdef PARM_HAVE_CUDA
#include "model/cuda/dense_ops_cuda.h"
#endif

namespace parm::model {
namespace {

int64_t cpu_attention_scratch(const AttentionShape& s) { return s.seq_len * s.seq_len; }

void cpu_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              const float* a, const float* b, float* c, bool accumulate) {
  dense_gemm(p, trans_a, trans_b, m, n, k, a, b, c, accumulate);
}


void cpu_copy(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

double cpu_sum_of_squares(const float* const* bufs, const int64_t* sizes, int64_t count,
                          double acc) {
  for (int64_t b = 0; b < count; ++b) acc += cpu::sum_of_squares(bufs[b], sizes[b]);
  return acc;
}

void cpu_adamw(const AdamWStep& s, float* w, const float* g, float* m, float* v, int64_t n) {
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  cpu::AdamWScalars c;
  c.beta1 = static_cast<float>(s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.grad_scale = static_cast<float>(s.grad_scale);
  c.step_size = static_cast<float>(s.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = static_cast<float>(s.eps);
  c.decay = s.decay ? static_cast<float>(1.0 - s.lr * s.weight_decay) : 1.0f;
  cpu::adamw(c, w, g, m, v, n);
}

void cpu_gemm_bf16_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
                            const uint16_t* packed_b, float* c, bool accumulate) {
  cpu::gemm_bf16_packed_b(trans_a, m, n, k, a, std::max<int64_t>(1, trans_a ? m : k), packed_b, c,
                          std::max<int64_t>(1, n), accumulate);
}

void cpu_bf16_pack_a(bool trans, int64_t m, int64_t k, const float* a, uint16_t* packed) {
  cpu::bf16_pack_a(trans, m, k, a, std::max<int64_t>(1, trans ? m : k), packed);
}

void cpu_bf16_pack_b(int64_t k, int64_t n, const float* b, uint16_t* packed) {
  cpu::bf16_pack_b(false, k, n, b, std::max<int64_t>(1, n), packed);
}

void cpu_gemm_bf16_packed(int64_t m, int64_t n, int64_t k, const uint16_t* packed_a,
                          const uint16_t* packed_b, float* c, bool accumulate) {
  cpu::gemm_bf16_packed(m, n, k, packed_a, packed_b, c, std::max<int64_t>(1, n), accumulate);
}

void* cpu_alloc_bytes(size_t bytes) { return std::calloc(1, bytes); }
void cpu_free_bytes(void* p) { std::free(p); }
void cpu_upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

DenseOps make_cpu_ops() {
  DenseOps o;
  o.device = Device::kCpu;
  o.linear_forward = linear_forward;
  o.linear_backward = linear_backward;
  o.gemm = cpu_gemm;
  o.embedding_forward = embedding_forward;
  o.embedding_backward = embedding_backward;
  o.attention_forward = attention_forward;
  o.attention_backward = attention_backward;
  o.attention_scratch = cpu_attention_scratch;
  o.cross_entropy = cross_entropy;
  o.ce_row_max = cpu::ce_row_max;
  o.ce_row_sums = cpu::ce_row_sums;
  o.ce_finish = cpu::ce_finish;
  o.layernorm_forward = cpu::layernorm_forward;
  o.layernorm_backward = cpu::layernorm_backward;
  o.layernorm_backward_add = cpu::layernorm_backward_add;
  o.bias_gelu_forward = cpu::bias_gelu_forward;
  o.gelu_backward = cpu::gelu_backward;
  o.add_bias = cpu::add_bias;
  o.bias_backward = cpu::bias_backward;
  o.gather_rows = cpu::gather_rows;
  o.scatter_add_rows = cpu::scatter_add_rows;
  o.add = cpu::add;
  o.copy = cpu_copy;
  o.sum_of_squares = cpu_sum_of_squares;
  o.adamw = cpu_adamw;
  o.bf16_packed_b_size = cpu::bf16_packed_b_size;
  o.bf16_pack_b_both = cpu::bf16_pack_b_both;
  o.gemm_bf16_packed_b = cpu_gemm_bf16_packed_b;
  o.bf16_packed_a_size = cpu::bf16_packed_a_size;
  o.bf16_pack_a = cpu_bf16_pack_a;
  o.bf16_pack_b = cpu_bf16_pack_b;
  o.gemm_bf16_packed = cpu_gemm_bf16_packed;
  o.bias_gelu_bf16 = cpu::bias_gelu_bf16;
  o.bias_gelu_backward_bf16 = cpu::bias_gelu_backward_bf16;
  o.bias_gelu_pack_a_bf16 = cpu::bias_gelu_pack_a_bf16;
  o.bias_gelu_backward_pack_a_bf16 = cpu::bias_gelu_backward_pack_a_bf16;
  o.alloc_bytes = cpu_alloc_bytes;
  o.free_bytes = cpu_free_bytes;
  o.upload = cpu_upload;
  return o;
}

}  // namespace

const DenseOps& dense_ops(Device device) {
  static const DenseOps cpu = make_cpu_ops();
  if (device == Device::kCpu) return cpu;
#ifdef PARM_HAVE_CUDA
  return cuda_dense_ops();
#else
  throw InvalidConfig(fmt::format("dense ops on {}: this build has no CUDA backend (configure "
                                  "with -DPARM_CUDA=ON); valid here: cpu",
                                  device_name(device)));
#endif
}

void check_token_range(const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t vocab) {
  for (int64_t t = 0; t < batch * seq_len; ++t)
    PARM_CHECK(tokens[t] >= 0 && tokens[t] < vocab,
               "token {} at (sequence {}, position {}) is outside the vocabulary [0, {})",
               tokens[t], t / seq_len, t % seq_len, vocab);
}

}  // namespace parm::model
