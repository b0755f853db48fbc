#include "model/bf16_weights.h"

#include "parm/error.h"

namespace parm::model {

void Bf16WeightPacks::invalidate() {
  for (Entry& e : entries_) e.fresh = false;
}

void Bf16WeightPacks::begin_pass() {
  if (version_ != kUnknownVersion && version_ == packed_version_) return;
  invalidate();
  packed_version_ = version_;
}

PackedWeight Bf16WeightPacks::get(const float* w, int64_t rows, int64_t cols) {
  PARM_CHECK(available(), "bf16 weight packs on {}: its dense ops table packs no weights",
             device_name(ops_->device));
  Entry* e = nullptr;
  for (Entry& x : entries_)
    if (x.src == w) e = &x;
  if (e == nullptr) {
    Entry fresh;
    fresh.src = w, fresh.rows = rows, fresh.cols = cols;
    fresh.w.resize(static_cast<size_t>(ops_->bf16_packed_b_size(rows, cols)));
    fresh.wt.resize(static_cast<size_t>(ops_->bf16_packed_b_size(cols, rows)));
    entries_.push_back(std::move(fresh));
    e = &entries_.back();
  }
  PARM_CHECK(e->rows == rows && e->cols == cols,
             "bf16 weight packs: the weight at {} was packed as ({}, {}), now asked as ({}, {})",
             static_cast<const void*>(w), e->rows, e->cols, rows, cols);
  if (!e->fresh) {
    ops_->bf16_pack_b_both(rows, cols, w, e->w.data(), e->wt.data());
    e->fresh = true;
    ++packs_done_;
  }
  return {e->w.data(), e->wt.data()};
}

void linear_forward_packed(const DenseOps& ops, const float* x, PackedWeight w, const float* b,
                           float* y, int64_t rows, int64_t in, int64_t out) {
  ops.gemm_bf16_packed_b(false, rows, out, in, x, w.w, y, /*accumulate=*/false);  // x (T, in) w
  if (b != nullptr) ops.add_bias(y, b, rows, out);
}

void linear_backward_packed(const DenseOps& ops, const float* dy, const float* x, PackedWeight w,
                            float* dx, float* dw, float* db, int64_t rows, int64_t in,
                            int64_t out, bool accumulate_dx) {
  ops.gemm(Precision::kBf16, true, false, in, out, rows, x, dy, dw, /*accumulate=*/true);
  if (db != nullptr) ops.bias_backward(dy, db, rows, out);
  if (dx != nullptr)  // dy (T, out) w^T
    ops.gemm_bf16_packed_b(false, rows, in, out, dy, w.wt, dx, accumulate_dx);
}

void linear_forward_packed_x(const DenseOps& ops, const uint16_t* packed_x, PackedWeight w,
                             const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  ops.gemm_bf16_packed(rows, out, in, packed_x, w.w, y, /*accumulate=*/false);
  if (b != nullptr) ops.add_bias(y, b, rows, out);
}

void linear_backward_packed_x(const DenseOps& ops, const float* dy, const uint16_t* packed_xt,
                              PackedWeight w, uint16_t* dy_packed, float* dx, float* dw,
                              float* db, int64_t rows, int64_t in, int64_t out,
                              bool accumulate_dx) {
  ops.bf16_pack_b(rows, out, dy, dy_packed);
  ops.gemm_bf16_packed(in, out, rows, packed_xt, dy_packed, dw, /*accumulate=*/true);
  if (db != nullptr) ops.bias_backward(dy, db, rows, out);
  if (dx != nullptr)  // dy (T, out) w^T
    ops.gemm_bf16_packed_b(false, rows, in, out, dy, w.wt, dx, accumulate_dx);
}

}  // namespace parm::model
