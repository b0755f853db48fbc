#include "model/cuda/dense_ops_cuda.h"

#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/runtime.h"
#include "model/cuda/dense_add.h"

namespace parm::model {
namespace {

// A device double of the process (the loss and the norm's sum come back through it; one host
// thread drives the stream, as the kernel library's workspace assumes).
double* device_scalar() {
  static double* p = static_cast<double*>(device_alloc(sizeof(double)));
  return p;
}

// The scalar, after the work queued before it, on the host.
double read_scalar(const double* d) {
  double h = 0.0;
  device_copy(&h, d, sizeof(double));  // waits for the stream
  return h;
}

void gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          const float* a, const float* b, float* c, bool accumulate) {
  cuda::dense_gemm(p, trans_a, trans_b, m, n, k, a, b, c, accumulate);
}

// attention_backward's dscores: unused on the device (the kernel library keeps one head's
// scores for the batch in its workspace).
int64_t attention_scratch(const AttentionShape&) { return 1; }

double cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                     int64_t vocab, float scale) {
  double* sum = device_scalar();
  PARM_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double), cuda::stream()));
  cuda::cross_entropy(logits, targets, dlogits, n, vocab, scale, sum);
  cuda::check_index_errors();  // the CPU's message for a target outside the vocabulary
  return read_scalar(sum);
}

double ce_finish(const float* logits, const float* row_max, const double* stats,
                 const int32_t* targets, float* dlogits, int64_t n, int64_t cols, float scale) {
  double* sum = device_scalar();
  PARM_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double), cuda::stream()));
  cuda::ce_finish(logits, row_max, stats, targets, dlogits, n, cols, scale, sum);
  return read_scalar(sum);
}

void bias_backward(const float* dy, float* dbias, int64_t rows, int64_t cols) {
  cuda::bias_backward(dy, dbias, rows, cols);
}

void copy(float* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  PARM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, cuda::stream()));
}

double sum_of_squares(const float* const* bufs, const int64_t* sizes, int64_t count,
                      double acc) {
  double* sum = device_scalar();
  PARM_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double), cuda::stream()));
  for (int64_t b = 0; b < count; ++b) cuda::sum_squares(bufs[b], sizes[b], sum);
  return acc + read_scalar(sum);
}

void adamw(const AdamWStep& s, float* w, const float* g, float* m, float* v, int64_t n) {
  cuda::adamw_step(w, g, m, v, n, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step,
                   s.grad_scale, s.decay);
}

DenseOps make_cuda_ops() {
  DenseOps o;
  o.device = Device::kCuda;
  o.linear_forward = cuda::linear_forward;
  o.linear_backward = cuda::linear_backward;
  o.gemm = gemm;
  o.embedding_forward = cuda::embedding_forward;
  o.embedding_backward = cuda::embedding_backward;
  o.attention_forward = cuda::attention_forward;
  o.attention_backward = cuda::attention_backward;
  o.attention_scratch = attention_scratch;
  o.cross_entropy = cross_entropy;
  o.ce_row_max = cuda::ce_row_max;
  o.ce_row_sums = cuda::ce_row_sums;
  o.ce_finish = ce_finish;
  o.layernorm_forward = cuda::layernorm_forward;
  o.layernorm_backward = cuda::layernorm_backward;
  o.bias_gelu_forward = cuda::bias_gelu_forward;
  o.gelu_backward = cuda::gelu_backward;
  o.add_bias = cuda::add_bias;
  o.bias_backward = bias_backward;
  o.gather_rows = cuda::gather_rows;
  o.scatter_add_rows = cuda::scatter_add_rows;
  o.add = cuda_add;
  o.copy = copy;
  o.sum_of_squares = sum_of_squares;
  o.adamw = adamw;
  o.alloc_bytes = device_alloc;
  o.free_bytes = device_free;
  o.upload = device_copy;
  return o;
}

}  // namespace

const DenseOps& cuda_dense_ops() {
  static const DenseOps ops = make_cuda_ops();
  return ops;
}

}  // namespace parm::model
