// Dropless: the dispatch writes the routed rows only (and the combine's adjoint its routed
// rows only); with a capacity factor the rest of the buffer is zeroed as before.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "moe/backend.h"
#include "moe/reference_moe.h"
#include "schedule/schedule.h"

namespace parm {
namespace {

constexpr float kPoison = 7.5f;  // no routed row holds this value

struct Counted {
  int64_t routed = 0, poisoned = 0, zero = 0;
};

// Rows of buf (E * slots, M): routed (expert e's first fill[e] slots), the others by content.
Counted count_rows(const Tensor& buf, const std::vector<int64_t>& fill, int64_t slots,
                   int64_t M) {
  Counted c;
  for (size_t e = 0; e < fill.size(); ++e)
    for (int64_t s = 0; s < slots; ++s) {
      const float* row = buf.data() + (static_cast<int64_t>(e) * slots + s) * M;
      if (s < fill[e]) {
        ++c.routed;
        continue;
      }
      bool poisoned = true, zero = true;
      for (int64_t m = 0; m < M; ++m) {
        poisoned = poisoned && row[m] == kPoison;
        zero = zero && row[m] == 0.0f;
      }
      c.poisoned += poisoned;
      c.zero += zero;
    }
  return c;
}

// A one-rank backend's sizes (every expert local, hidden shard 8).
moe::BackendSizes one_rank_sizes(int64_t T, int64_t M, int64_t E, int k, int64_t slots,
                                 bool dropless, bool packed) {
  moe::BackendSizes sizes;
  sizes.gate_rows = T;
  sizes.experts = E;
  sizes.topk = k;
  sizes.model_dim = M;
  sizes.local_experts = E;
  sizes.hidden_shard = 8;
  sizes.max_expert_rows = slots;
  sizes.dropless = dropless;
  sizes.packed = packed;
  return sizes;
}

TEST(DroplessDispatch, UnroutedRowsAreNeitherZeroedNorWritten) {
  const int64_t T = 16, M = 4, E = 4;
  const int k = 2;
  for (bool dropless : {true, false}) {
    const MoeShape shape = MoeShape::of(T, M, 8, E, k, dropless ? "none" : "2.0");
    const int64_t slots = capacity(k, shape.capacity_factor, T, E);
    auto backend = moe::make_cpu_backend(one_rank_sizes(T, M, E, k, slots, dropless, false));
    const auto params = ref::init_params<float>(shape, 3);
    Tensor x({T, M}), wg({M, E});
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = 0.25f * static_cast<float>((i * 7) % 11) - 1.0f;
    for (int64_t i = 0; i < wg.numel(); ++i) wg[i] = params.wg[static_cast<size_t>(i)];
    std::vector<float> stats(static_cast<size_t>(schedule::stats_numel(E, true)));
    backend->gate_forward(x, wg, k, slots, slots, stats.data(), nullptr);
    const std::vector<int64_t> fill = backend->fill();
    Tensor buf({E * slots, M}), dbuf({E * slots, M}), out({T, M});
    buf.fill(kPoison);
    dbuf.fill(kPoison);
    backend->dispatch_forward(x, buf);
    backend->combine_forward(buf, out);
    backend->combine_backward(buf, out, dbuf);
    for (const Tensor* t : {&buf, &dbuf}) {
      const Counted c = count_rows(*t, fill, slots, M);
      const int64_t unrouted = E * slots - c.routed;
      const char* what = t == &buf ? "dispatch" : "combine backward";
      ASSERT_GT(unrouted, 0) << what;
      if (dropless) {
        EXPECT_EQ(c.routed, T * k) << what;
        EXPECT_EQ(c.poisoned, unrouted) << what << ": unrouted rows were written";
      } else {
        EXPECT_EQ(c.zero, unrouted) << what << ": unfilled rows not zeroed";
      }
    }
  }
}

// The packed layout (moe::pack_routing): the dispatch buffer holds expert e's routed rows at
// rows [sum of fill before e, + fill[e]), nothing else, and the combine (and its adjoint)
// read them there: the same rows, outputs and gradients, bit for bit, as the C = T layout.
TEST(DroplessDispatch, PackedRowsAreTheRoutedRowsBackToBack) {
  const int64_t T = 16, M = 4, E = 4;
  const int k = 2;
  const MoeShape shape = MoeShape::of(T, M, 8, E, k, "none");
  const int64_t slots = capacity(k, shape.capacity_factor, T, E);
  const auto params = ref::init_params<float>(shape, 5);
  Tensor x({T, M}), wg({M, E});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = 0.25f * static_cast<float>((i * 5) % 13) - 1.5f;
  for (int64_t i = 0; i < wg.numel(); ++i) wg[i] = params.wg[static_cast<size_t>(i)];
  struct Run {
    Tensor buf, dbuf, out;
    std::vector<float> dx;
    std::vector<int64_t> fill;
    std::vector<int64_t> slot;  // each choice's slot in its expert
  };
  auto run = [&](bool packed) {
    auto backend = moe::make_cpu_backend(one_rank_sizes(T, M, E, k, slots, true, packed));
    std::vector<float> stats(static_cast<size_t>(schedule::stats_numel(E, true)));
    backend->gate_forward(x, wg, k, slots, slots, stats.data(), nullptr);
    const int64_t rows = packed ? T * k : E * slots;  // k T: every choice routed
    Run r{Tensor({rows, M}), Tensor({rows, M}), Tensor({T, M}), {}, backend->fill(), {}};
    r.buf.fill(kPoison);
    r.dbuf.fill(kPoison);
    backend->dispatch_forward(x, r.buf);
    backend->combine_forward(r.buf, r.out);
    backend->combine_backward(r.buf, r.out, r.dbuf);
    Tensor dx({T, M});
    dx.zero();
    backend->dispatch_backward(r.dbuf, dx);
    r.dx.assign(dx.data(), dx.data() + dx.numel());
    for (size_t i = 0; i < backend->routing().row.size(); ++i)
      r.slot.push_back(backend->routing().slot(i));
    return r;
  };
  const Run wide = run(false), packed = run(true);
  ASSERT_EQ(wide.fill, packed.fill);
  EXPECT_EQ(wide.slot, packed.slot);  // the same slots, whichever layout numbers the rows
  int64_t at = 0;  // packed row of expert e's slot 0
  for (int64_t e = 0; e < E; ++e) {
    const int64_t f = wide.fill[static_cast<size_t>(e)];
    for (const auto& [w, p] : {std::pair{&wide.buf, &packed.buf}, std::pair{&wide.dbuf, &packed.dbuf}})
      EXPECT_EQ(std::memcmp(p->data() + at * M, w->data() + e * slots * M,
                            static_cast<size_t>(f * M) * sizeof(float)),
                0)
          << "expert " << e;
    at += f;
  }
  EXPECT_EQ(at, T * k);
  EXPECT_EQ(std::memcmp(wide.out.data(), packed.out.data(), static_cast<size_t>(T * M) * 4), 0);
  EXPECT_EQ(wide.dx, packed.dx);
}

// The CPU backend's take_chunk (the row exchanges' local copies): the same values below and
// above the size it streams at (cpu::streamed: 8 MiB), at an unaligned chunk, nothing written
// beside the slice it takes.
TEST(DroplessDispatch, TakeChunkCopiesTheSliceAtEverySize) {
  auto backend = moe::make_cpu_backend(one_rank_sizes(4, 4, 4, 2, 4, true, true));
  const int64_t big = (int64_t{8} << 20) / 4 + 37;  // floats: one chunk past the threshold
  for (const int64_t chunk : {int64_t{1000}, big}) {
    for (const int64_t outer : {int64_t{1}, int64_t{2}}) {
      const int n = 3, j = 1;
      std::vector<float> full(static_cast<size_t>(outer * n * chunk));
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i % 9973) - 0.5f;
      std::vector<float> mine(static_cast<size_t>(outer * chunk + 2), kPoison);
      backend->take_chunk(full.data(), outer, n, j, chunk, mine.data() + 1);
      EXPECT_EQ(mine.front(), kPoison);
      EXPECT_EQ(mine.back(), kPoison);
      for (int64_t o = 0; o < outer; ++o)
        ASSERT_EQ(std::memcmp(mine.data() + 1 + o * chunk, full.data() + (o * n + j) * chunk,
                              static_cast<size_t>(chunk) * sizeof(float)),
                  0)
            << "chunk " << chunk << " outer " << outer << " block " << o;
    }
  }
}

}  // namespace
}  // namespace parm
