// The dense weights of a step rounded to bf16 once, in the two packed layouts the bf16
// products read (kernels/cpu/kernels.h): B of w for x w and B of w^T for dy w^T, reused by
// every product of the pass that reads them, forward and backward (the packing per call
// was a third of the bf16 dense products' time). Used where the device's table packs weights
// (DenseOps::bf16_pack_b_both set: the CPU) and the dense products run at bf16.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_buffer.h"
#include "model/dense_ops.h"

namespace parm::model {

// A weight w (rows, cols) packed: B of w (k = rows, n = cols) and B of w^T (k = cols, n = rows).
struct PackedWeight {
  const uint16_t* w = nullptr;
  const uint16_t* wt = nullptr;
};

class Bf16WeightPacks {
 public:
  // No one counts the weights' versions: every begin_pass() packs again.
  static constexpr uint64_t kUnknownVersion = 0;

  explicit Bf16WeightPacks(const DenseOps& ops) : ops_(&ops) {}
  // The table packs weights (the model then calls get() and the *_packed ops below).
  bool available() const { return ops_->bf16_pack_b_both != nullptr; }
  // The weights may have changed (an optimizer step, a load): the next get() of each weight
  // packs it again. Keeps the memory.
  void invalidate();
  // The version of the weights, a number that whoever writes them (the trainer's optimizer
  // step) changes with every write; kUnknownVersion when no one keeps count.
  void set_version(uint64_t v) { version_ = v; }
  // At the start of a forward pass: invalidate() unless the packs were made at the current
  // version, a known one (so with --grad-accum n a step's n passes pack once).
  void begin_pass();
  // w (rows, cols), fp32 in the table's memory: its packs, made at the first get() since the
  // last invalidate() and valid until the next. The same w must come with the same shape.
  // Allocates only at a weight's first get().
  PackedWeight get(const float* w, int64_t rows, int64_t cols);
  // Packings done since construction (tests: once per weight per invalidate()).
  int64_t packs_done() const { return packs_done_; }

 private:
  struct Entry {
    const float* src = nullptr;
    int64_t rows = 0, cols = 0;
    bool fresh = false;
    cpu::Bf16Buffer w, wt;  // 64-byte aligned: the AMX kernel loads each tile row from one line
  };
  const DenseOps* ops_;
  std::vector<Entry> entries_;  // a few per block: looked up in order
  int64_t packs_done_ = 0;
  uint64_t version_ = kUnknownVersion;
  uint64_t packed_version_ = kUnknownVersion;  // the version at the last invalidate()
};

// linear_forward at bf16 with w (in, out) packed: y (rows, out) = x w (+ b). Overwrites y.
// The same bits as linear_forward(..., Precision::kBf16).
void linear_forward_packed(const DenseOps& ops, const float* x, PackedWeight w, const float* b,
                           float* y, int64_t rows, int64_t in, int64_t out);
// linear_backward at bf16 with w packed: dw += x^T dy, db += column sums of dy (db may be
// null), dx = dy w^T (+= when accumulate_dx; dx may be null). The same bits as
// linear_backward(..., Precision::kBf16).
void linear_backward_packed(const DenseOps& ops, const float* dy, const float* x, PackedWeight w,
                            float* dx, float* dw, float* db, int64_t rows, int64_t in,
                            int64_t out, bool accumulate_dx);

// An activation x (rows, in) that feeds several products (LN1's output: Q, K and V) rounded
// once: packed_x is x packed as A (DenseOps::bf16_pack_a, not transposed), packed_xt x^T
// packed as A (transposed). The same bits as linear_forward_packed / linear_backward_packed.
// y (rows, out) = x w (+ b). Overwrites y.
void linear_forward_packed_x(const DenseOps& ops, const uint16_t* packed_x, PackedWeight w,
                             const float* b, float* y, int64_t rows, int64_t in, int64_t out);
// dw += x^T dy, db += column sums of dy (db may be null), dx = dy w^T (+= when
// accumulate_dx; dx may be null). dy_packed: bf16_packed_b_size(rows, out) values, scratch.
void linear_backward_packed_x(const DenseOps& ops, const float* dy, const uint16_t* packed_xt,
                              PackedWeight w, uint16_t* dy_packed, float* dx, float* dw,
                              float* db, int64_t rows, int64_t in, int64_t out,
                              bool accumulate_dx);

}  // namespace parm::model
