// Launchers of the CUDA kernels of the MoE gate, dispatch, combine, their adjoints and the
// layer's local data movement (moe_kernels.cu). Plain C++: every pointer is device memory of
// the process's GPU, owned by the caller; every size is a count of elements (int64). All
// work is queued on parm::cuda::stream() and returns at once; a launch error throws
// parm::Error. Zero-sized calls queue nothing.
//
// The maths per row / element is kernels/math/moe_math.h, shared with the CPU test that checks it
// against moe/moe_ops.h. Nothing here uses float atomics: every result is the same bits on
// every run. Routing indices are int32 (the callers check that E * slots fits).
#pragma once

#include <cstdint>

namespace parm::cuda {

// ---- gate forward ----

// y (rows, cols) = softmax of each row of x (rows, cols); y may alias x. Overwrites y.
void moe_softmax(const float* x, float* y, int64_t rows, int64_t cols);

// Per row of probs (rows, E): expert / prob (rows, k) = its top-k (largest first, ties to
// the lower expert, as cpu::topk) and weight (rows, k) = the combine weights (the k
// probabilities, renormalised to sum 1 when k > 1). Overwrites all three. 1 <= k <= E.
void moe_topk_weights(const float* probs, int64_t rows, int64_t experts, int k, int32_t* expert,
                      float* prob, float* weight);

// GShard slots and the l_aux statistics of one gate call over `rows` tokens.
// In: expert (rows, k) from moe_topk_weights, probs (rows, E).
// Out (all overwritten):
//   row (rows, k)     e * slots + position of the choice in expert e's priority order (all
//                     1st choices in token order, then all 2nd choices, ...), or -1 when
//                     that position is >= capacity (dropped);
//   source (E, rows)  source[e * rows + s] = the choice index t * k + j that took slot s of
//                     expert e, for s < fill[e] (the rest are left as they were);
//   fill (E)          slots taken, min(choices of e, capacity);
//   stats (2E)        [1st-choice count of e (before drops), sum over rows of probs[:, e]]:
//                     counts exact; sums in a fixed order (a block tree), not the CPU's.
// capacity <= slots.
void moe_slots_stats(const int32_t* expert, const float* probs, int64_t rows, int64_t experts,
                     int k, int64_t capacity, int64_t slots, int32_t* row, int32_t* source,
                     int32_t* fill, float* stats);

// Dropless, packed layout (moe::pack_routing): renumbers the kept rows of a routing from
// moe_slots_stats (e * slots + slot) to first[e] + slot, first (E) = the exclusive prefix sum
// of fill, computed on the device from fill (nothing is read on the host, so a captured
// launch stays right for any counts). Overwrites row (rows * k choices) and first.
void moe_pack_routing(const int32_t* expert, const int32_t* fill, int64_t rows, int k,
                      int64_t experts, int64_t slots, int32_t* row, int32_t* first);

// ---- gate backward ----

// dprobs (rows, E) = dpsum (E) on every row, plus the adjoint of the combine weights w.r.t.
// the chosen probabilities (dweight (rows, k) from the combine; expert, prob (rows, k) from
// the forward). Overwrites dprobs.
void moe_weights_backward(const int32_t* expert, const float* prob, const float* dweight,
                          const float* dpsum, int64_t rows, int64_t experts, int k,
                          float* dprobs);

// dx (rows, cols) = y * (dy - <y, dy>) per row; dx may alias dy. Overwrites dx.
void moe_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols);

// ---- dispatch / combine over a routing (row, source, fill from moe_slots_stats) ----

// buf (E * slots, M): row e * slots + s (s < fill[e]) = scale[c] * x row t, with c =
// source[e * rows + s] and t = c / k (scale null: a plain copy); the other rows zero.
// Overwrites every row of buf. Dispatch forward (scale null) and the dbuf of the combine
// backward (x = dout, scale = the combine weights).
void moe_gather_slots(const float* x, const int32_t* source, const int32_t* fill,
                      const float* scale, int64_t rows, int64_t experts, int k, int64_t slots,
                      int64_t model_dim, float* buf);

// The packed layout's moe_gather_slots: buf row row[c] = scale[c] * x row c / k for every
// kept choice c (scale null: a plain copy), the same values as moe_gather_slots writes;
// rows no choice names are left as they are (dropless: never read or sent). buf holds at
// least the routed rows.
void moe_scatter_choices(const float* x, const int32_t* row, const float* scale, int64_t rows,
                         int k, int64_t model_dim, float* buf);

// dx (rows, M) += dbuf rows row[t * k + j] of the kept choices, added in choice order.
// Accumulates.
void moe_dispatch_backward(const float* dbuf, const int32_t* row, int64_t rows, int k,
                           int64_t model_dim, float* dx);

// out (rows, M) = sum over kept choices of weight * buf row, in choice order. Overwrites.
void moe_combine_forward(const float* buf, const int32_t* row, const float* weight,
                         int64_t rows, int k, int64_t model_dim, float* out);

// dweight (rows, k) = <dout_t, buf row> for kept choices (the CPU's 16-lane order), 0 for
// dropped ones. Overwrites.
void moe_combine_dweight(const float* buf, const float* dout, const int32_t* row, int64_t rows,
                         int k, int64_t model_dim, float* dweight);

// ---- local data movement ----

// mine (outer, chunk) = full (outer, n, chunk)[:, j, :]. Overwrites mine.
void moe_take_chunk(const float* full, int64_t outer, int n, int j, int64_t chunk, float* mine);
// full (outer, n, chunk)[:, p, :] = parts (n, outer, chunk)[p] for every p. Overwrites full.
void moe_interleave(const float* parts, int64_t outer, int n, int64_t chunk, float* full);
// dst (count) += src (count).
void moe_add(float* dst, const float* src, int64_t count);

}  // namespace parm::cuda
