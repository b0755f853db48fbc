// How a row-major GEMM request (the semantics of parm::cpu::gemm) maps onto cuBLAS's
// column-major gemm. No CUDA headers: the CPU unit tests check the mapping against a naive
// column-major GEMM that reads exactly these arguments (tests/unit/test_cuda_gemm_args.cpp).
//
// A row-major (r, c) array with leading dimension c is, read column-major with the same
// leading dimension, the (c, r) matrix of its transpose. So the row-major C (m, n) is the
// column-major C^T (n, m), and C^T = op(B)^T op(A)^T: cuBLAS gets B as its first operand and
// A as its second, with each op flag as the request's, and m and n swapped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace parm::cuda {

// The arguments of the cuBLAS call: C_cm (m, n) = op(first) op(second), column-major,
// where first = the request's B pointer, second = the request's A pointer, C_cm = the
// request's C pointer. Leading dimensions are at least 1 (cuBLAS refuses 0 even for empty
// matrices).
struct ColumnMajorGemm {
  bool trans_first = false;   // cuBLAS transa (applies to the request's B)
  bool trans_second = false;  // cuBLAS transb (applies to the request's A)
  int64_t m = 0, n = 0, k = 0;
  int64_t ld_first = 1, ld_second = 1, ldc = 1;
};

// Row-major request: C (m, n) (+)= op(A) (m, k) op(B) (k, n), A stored (m, k) or, when
// trans_a, (k, m); B stored (k, n) or, when trans_b, (n, k); all contiguous.
inline ColumnMajorGemm column_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                         int64_t k) {
  ColumnMajorGemm g;
  g.trans_first = trans_b;
  g.trans_second = trans_a;
  g.m = n;
  g.n = m;
  g.k = k;
  // The stored row length of each operand is its column-major leading dimension.
  g.ld_first = std::max<int64_t>(1, trans_b ? k : n);
  g.ld_second = std::max<int64_t>(1, trans_a ? m : k);
  g.ldc = std::max<int64_t>(1, n);
  return g;
}

}  // namespace parm::cuda

namespace parm::cuda {

// One product of a group, row-major as gemm() (gemm.h): A, B, C pointers into device memory
// in the operand and output types of the call.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

// The host arrays of one cublasGemmGroupedBatchedEx call. cuBLAS's grouped call takes
// group_count groups; every product of group g shares its flags, sizes, leading dimensions,
// alpha and beta, and the pointer arrays hold group 0's products, then group 1's, and so on
// (group g's first product at offset[g] = group_size[0] + ... + group_size[g - 1]).
// Products whose column-major calls are equal share a group (experts with the same row count,
// or the weight gradients of equal-sized shards), so the call carries as few groups as the
// sizes allow. Flags are bools here (cuBLAS's enum is gemm.cpp's business).
struct GroupedGemmArgs {
  // Per group:
  std::vector<ColumnMajorGemm> groups;
  std::vector<int> group_size;
  std::vector<int64_t> offset;
  // Per product, group by group: the index of the product in the request, and cuBLAS's first
  // operand (the request's B), second operand (the request's A) and C.
  std::vector<int64_t> order;
  std::vector<const void*> first, second;
  std::vector<void*> c;

  // Scratch of plan_grouped_gemm.
  std::vector<int64_t> group_of, cursor;

  void reserve(size_t products) {
    groups.reserve(products);
    group_size.reserve(products);
    offset.reserve(products);
    cursor.reserve(products);
    group_of.reserve(2 * products);
    order.reserve(products);
    first.reserve(products);
    second.reserve(products);
    c.reserve(products);
  }
  int64_t num_products() const { return static_cast<int64_t>(order.size()); }
  int64_t num_groups() const { return static_cast<int64_t>(groups.size()); }
};

inline bool same_call(const ColumnMajorGemm& x, const ColumnMajorGemm& y) {
  return x.trans_first == y.trans_first && x.trans_second == y.trans_second && x.m == y.m &&
         x.n == y.n && x.k == y.k && x.ld_first == y.ld_first && x.ld_second == y.ld_second &&
         x.ldc == y.ldc;
}

// Fills `args` (overwritten; allocates nothing once reserve()d for `count`) for the products
// problems[i] for i < count, all with the flags trans_a / trans_b, leaving out every product
// with m, n or k == 0 (the caller handles those without cuBLAS). Groups are numbered in the
// order their first product appears; inside a group products keep the request's order.
inline void plan_grouped_gemm(bool trans_a, bool trans_b, const GemmProblem* problems,
                              int64_t count, GroupedGemmArgs& args) {
  args.groups.clear();
  args.group_size.clear();
  args.group_of.clear();
  // The group of every kept product, by a linear scan over the groups so far (a layer has at
  // most a few hundred local experts, and usually a handful of distinct row counts).
  for (int64_t i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    if (p.m == 0 || p.n == 0 || p.k == 0) continue;
    const ColumnMajorGemm g = column_major_gemm(trans_a, trans_b, p.m, p.n, p.k);
    size_t gi = 0;
    while (gi < args.groups.size() && !same_call(args.groups[gi], g)) ++gi;
    if (gi == args.groups.size()) {
      args.groups.push_back(g);
      args.group_size.push_back(0);
    }
    ++args.group_size[gi];
    args.group_of.push_back(i);  // (product, group) pairs, flattened
    args.group_of.push_back(static_cast<int64_t>(gi));
  }
  // A stable counting sort by group: offset[g] is where group g starts.
  const size_t num = args.group_of.size() / 2, groups = args.groups.size();
  args.offset.resize(groups);
  int64_t at = 0;
  for (size_t g = 0; g < groups; ++g) {
    args.offset[g] = at;
    at += args.group_size[g];
  }
  args.cursor.assign(args.offset.begin(), args.offset.end());
  args.order.resize(num);
  args.first.resize(num);
  args.second.resize(num);
  args.c.resize(num);
  for (size_t j = 0; j < num; ++j) {
    const int64_t i = args.group_of[2 * j];
    const size_t to = static_cast<size_t>(args.cursor[static_cast<size_t>(args.group_of[2 * j + 1])]++);
    const GemmProblem& p = problems[i];
    args.order[to] = i;
    args.first[to] = p.b;
    args.second[to] = p.a;
    args.c[to] = p.c;
  }
}

}  // namespace parm::cuda
