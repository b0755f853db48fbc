// The local experts (ESP shards) on the GPU: the contract of moe::experts_forward /
// experts_backward (moe_ops.h) over device tensors. Every step covers all local experts at
// once: one segment-copy gather into the grouped products' row layout (each expert's filled
// rows back to back in its own block, or under dropless at its place in one pool:
// expert_row_offsets in expert_rows.h), one grouped cuBLAS call per product
// (kernels/cuda/gemm.h), one kernel for bias + GeLU and one for its adjoint with the bias
// gradient (kernels/cuda/expert_kernels.h), and one scatter, which adds b2 on the way.
// CUDA builds only.
//
// Everything is queued on cuda::stream() and nothing waits for the GPU, except that with a
// non-null `times` the stream is synchronised before every phase lap so the phase times are
// the GPU's (the phases are the CPU path's names).
//
// CUDA graphs (set_graphs(true); off by default): a pass called with the same key as the
// pass before it (pass_graphs.h: the same tensors, sizes and fill counts), and no `times`,
// is captured into a graph and launched; later passes with that key launch the graph again,
// one launch instead of a dozen. Any other pass runs its launches as they are. A capture that
// fails turns graphs off for that direction for good.
//
// Precision::kFp32: every buffer and product is fp32 (the CPU oracle's semantics).
// Precision::kBf16: the rows between the products are bf16, as in every bf16 MoE: the
// gathered x and dy, pre, act, the products' row outputs (out, dact, dx; bf16 C, rounded
// once from the fp32 sum) and dpre; W1 and W2 are rounded to bf16 by a forward call when
// they changed (moe/bf16_weight_copies.h: other tensors, another version given to
// set_weights_version, or no version given: every forward call) and reused until then, by
// the backward call among others. The rounding is queued outside a pass's CUDA graph. Every product accumulates in fp32; the weight gradients
// accumulate into the fp32 dW, and the master weights, biases, bias gradients (column sums
// of the layer's fp32 dy and of dpre before its rounding) and the layer's input and output
// layouts stay fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/graph.h"
#include "moe/bf16_weight_copies.h"
#include "moe/cuda/pass_graphs.h"
#include "moe/moe_ops.h"
#include "parm/device.h"
#include "parm/tensor.h"

namespace parm::moe::cuda {

struct ProductOperands;  // device_experts.cpp: where each product's operands are

class DeviceExperts {
 public:
  // Allocates the whole workspace once, for e_loc experts of at most max_rows filled rows
  // each (blocks * slots of any call must not exceed it), model dim M and hidden shard Hl.
  // max_total_rows (dropless; 0: none) bounds the rows all experts get together in one pass:
  // each row buffer is then one pool of that many rows (plus each expert's alignment),
  // expert e's rows after those of the experts before it (expert_row_offsets, the CPU
  // backend's ExpertWorkspace), instead of e_loc blocks of max_rows rows; it must be at
  // least max_rows (one expert may take every row).
  DeviceExperts(int64_t e_loc, int64_t max_rows, int64_t model_dim, int64_t hidden_shard,
                Precision p, int64_t max_total_rows = 0);

  // Same contract as moe::experts_forward: in/out (blocks, E_loc, slots, M) on the GPU, the
  // weights w on the GPU (fp32), fills on the HOST (int32, blocks * E_loc). Overwrites out
  // (zero at empty slots). Keeps the rows and activations for backward(). first (HOST, may
  // be null; dropless, packed): segment [b, e] starts at row first[b * E_loc + e] of in/out,
  // which then hold at least the routed rows (shape/packed_rows.h); only its rows are written.
  void forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
               const int32_t* fills, const int64_t* first, bool add_b2, Tensor& out,
               PhaseTimes* times = nullptr);
  // Same contract as moe::experts_backward, after forward() with the same fills and weights:
  // accumulates dw (dW1, db1, dW2 of this shard, db2 whole), overwrites din (zero at empty
  // slots); first as in forward().
  void backward(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                const int32_t* fills, const int64_t* first, ExpertShards& dw, Tensor& din,
                PhaseTimes* times = nullptr);

  // Filled rows per expert in the last forward().
  const std::vector<int64_t>& rows() const { return rows_; }
  // Whether the row buffers are one pool (max_total_rows > 0).
  bool pooled() const { return max_total_rows_ > 0; }
  // Device memory held by the workspace (bytes).
  int64_t held_bytes() const { return held_bytes_; }
  Precision precision() const { return precision_; }
  // The version of the weights the next forward() is given (Bf16WeightCopies): whoever
  // writes them changes it with every write. Unset (kUnknownVersion): every forward() at bf16
  // rounds W1 and W2 again.
  void set_weights_version(uint64_t v) { weight_copies_.set_version(v); }
  // Times W1 and W2 were rounded to bf16 so far.
  int64_t weight_copies_made() const { return weight_copies_.copies_made(); }
  // The grouped-GEMM helper (tests force its loop mode to compare the two paths).
  parm::cuda::GroupedGemm& grouped_gemm() { return gemm_; }
  // CUDA graphs for the steady state (see above), and what they did so far.
  void set_graphs(bool on);
  const GraphPolicy& forward_graphs() const { return fwd_policy_; }
  const GraphPolicy& backward_graphs() const { return bwd_policy_; }
  // Why a capture failed ("" when none did): forward, backward.
  std::string graph_failures() const {
    return "forward: '" + fwd_graph_.failure() + "', backward: '" + bwd_graph_.failure() + "'";
  }

 private:
  // A zero-filled device buffer of bf16 values (empty: data() is null).
  struct Bf16Buffer {
    std::shared_ptr<void> mem;
    uint16_t* data() const { return static_cast<uint16_t*>(mem.get()); }
  };
  // The experts' row blocks of `cols` values for the kernels (rows of the last forward).
  parm::cuda::ExpertRows expert_rows(int64_t cols) const;
  // Sets rows_ from the fills and where each expert's rows start (at_m_, at_h_); throws,
  // before any work, when they do not fit the pools.
  void place_rows(const int32_t* fills, int64_t blocks, const char* what);
  Bf16Buffer bf16_buffer(int64_t elements);
  void check_call(const ExpertShards& w, const Tensor& a, const Tensor& b, int64_t blocks,
                  int64_t slots, const int32_t* fills, const int64_t* first,
                  const char* what) const;
  // The operands of the six products in this workspace (dw may be null in the forward pass).
  ProductOperands operands(const ExpertShards& w, ExpertShards* dw);
  // The launches of each pass (after the checks; rows_ set), timed when times is not null.
  // convert: round W1 and W2 to bf16 first (in the pass, so that a breakdown times it).
  void forward_work(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                    const int32_t* fills, const int64_t* first, bool add_b2, bool convert,
                    Tensor& out, PhaseTimes* times);
  // Rounds W1 and W2 to w1_bf16_, w2_bf16_ (queued) and records it.
  void convert_weights(const ExpertShards& w);
  void backward_work(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                     const int32_t* fills, const int64_t* first, ExpertShards& dw, Tensor& din,
                     PhaseTimes* times);
  // Runs `work` as policy says for key_ (eagerly, captured then launched, or replayed).
  void run_pass(GraphPolicy& policy, parm::cuda::StreamGraph& graph,
                const std::function<void()>& work);

  int64_t e_loc_, max_rows_, model_dim_, hidden_;
  int64_t max_total_rows_;       // 0: a block per expert
  int64_t stride_m_, stride_h_;  // elements of one expert's block of an (R, M) / (R, Hl) buffer
  int64_t elems_m_, elems_h_;    // elements of an (R, M) / (R, Hl) row buffer: pool or blocks
  Precision precision_;
  int64_t held_bytes_ = 0;
  std::vector<int64_t> rows_;  // (E_loc) filled rows of the last forward
  // (E_loc) expert e's first element in every (R, M) / (R, Hl) row buffer, for rows_
  // (expert_row_offsets: e * stride_m_ / e * stride_h_, or its place in the pool).
  std::vector<int64_t> at_m_, at_h_;
  bool have_forward_ = false;
  // Row buffers of elems_m_ (M-wide rows) or elems_h_ (Hl-wide) elements on the GPU, expert
  // e's rows from at_m_[e] or at_h_[e]:
  // fp32 (Precision::kFp32 only; empty at bf16)
  Tensor in_;        // (rows, M) the gathered rows
  Tensor pre_;       // (rows, Hl) x W1 (b1 added on the fly)
  Tensor act_;       // (rows, Hl) gelu(pre + b1)
  Tensor out_rows_;  // (rows, M) forward outputs; dx in the backward pass
  Tensor d_act_;     // (rows, Hl) dact, then dpre in place
  Tensor d_out_;     // (rows, M) the gathered output gradient
  // both precisions
  Tensor col_scratch_;                // column-sum partials
  std::vector<int64_t> block_rows_;   // (E_loc) one block's fill counts
  std::vector<int64_t> block_at_;     // (E_loc) its segments' first elements in the layout
  // bf16 (Precision::kBf16 only; empty at fp32), as the fp32 buffers above
  Bf16Buffer in_bf16_, pre_bf16_, act_bf16_, out_bf16_, d_out_bf16_;
  Bf16Buffer d_act_bf16_;          // dact, then dpre in place
  Bf16Buffer w1_bf16_, w2_bf16_;   // (E_loc, M, Hl), (E_loc, Hl, M)
  Bf16WeightCopies weight_copies_;  // what w1_bf16_ and w2_bf16_ hold
  parm::cuda::GroupedGemm gemm_;
  GraphPolicy fwd_policy_, bwd_policy_;
  parm::cuda::StreamGraph fwd_graph_, bwd_graph_;
  PassKey key_;  // the key of the pass being run (kept to reuse its memory)
  std::vector<parm::cuda::GemmProblem> problems_;  // (E_loc) reserved
};

// The cuBLAS floor: the six products of every expert (rows[e] rows each, each expert on its
// own scratch operands, through the same grouped path as DeviceExperts) alone on scratch
// device memory, `reps` times after one untimed round, timed with CUDA events; returns the
// median total in microseconds.
double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim, int64_t hidden,
                               int reps, Precision p);

}  // namespace parm::moe::cuda
