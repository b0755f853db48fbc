// The vocabulary-parallel embedding, LM head and cross-entropy (model/vocab_parallel.h): at
// every mp this world size allows (1, 2, 4, ...), each MP rank's shard of the loss, of the
// gradient at the head's input and of the tied table's gradient equals the unsplit head's at
// fp32 to 1e-6 relative, for vocabularies that mp divides and that it does not (257: BERT's),
// and at 32k; the embedding's output and gradient equal the unsplit ones bit for bit.
// (The whole models under mp and pp, the head included: test_model.cpp, test_pipeline.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "model/blocks.h"
#include "model/dense_ops.h"
#include "model/vocab_parallel.h"
#include "mpi_test_util.h"
#include "parm/rng.h"

namespace parm::model {
namespace {

constexpr double kTol = 1e-6;

std::vector<float> normal(int64_t n, uint64_t stream, float stddev) {
  Rng rng(77, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = stddev * rng.normal();
  return v;
}

double rel_err(const float* got, const float* want, int64_t n) {
  double err = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / scale;
}

// The mp values of this world size the test runs (every divisor in {1, 2, 4, 8}).
std::vector<int> mps() {
  std::vector<int> out;
  for (int mp : {1, 2, 4, 8})
    if (test::world_size() % mp == 0) out.push_back(mp);
  return out;
}

struct Head {
  double loss = 0.0;
  std::vector<float> dz;    // (n, M)
  std::vector<float> dwte;  // (rows, M) of the rows held
};

// logits = z wte^T, loss, dz = dlogits wte (summed over tp's group), dwte = dlogits^T z, for
// the rows `shard` of the table; fp32 products, as the model runs them.
Head run_head(TensorParallel& tp, const VocabShard& shard, const std::vector<float>& z,
              const std::vector<float>& wte_whole, const std::vector<int32_t>& targets,
              int64_t n, int64_t M, float scale) {
  const DenseOps& ops = dense_ops(Device::kCpu);
  const int64_t V = shard.size();
  const float* w = wte_whole.data() + shard.begin * M;
  std::vector<float> logits(static_cast<size_t>(n * V));
  ops.gemm(Precision::kFp32, false, true, n, V, M, z.data(), w, logits.data(), false);
  VocabParallelLoss loss(ops, shard, n);
  Head h;
  h.loss = loss.forward(tp, logits.data(), targets.data(), logits.data(), n, scale);
  h.dz.resize(static_cast<size_t>(n * M));
  ops.gemm(Precision::kFp32, false, false, n, M, V, logits.data(), w, h.dz.data(), false);
  tp.f_backward(h.dz.data(), n * M);
  h.dwte.assign(static_cast<size_t>(V * M), 0.0f);
  ops.gemm(Precision::kFp32, true, false, V, M, n, logits.data(), z.data(), h.dwte.data(), true);
  return h;
}

TEST(VocabParallel, HeadEqualsTheUnsplitHead) {
  const int64_t n = 24, M = 32;
  TopologyOptions so;
  so.self_only = true;
  const auto self = Topology::create(so);
  for (int mp : mps()) {
    auto topo = test::make_topology(mp, 1, 1);
    Communicator& mpc = topo->comm(Group::kMp);
    TensorParallel tp(mpc);
    for (int64_t V : {int64_t{256}, int64_t{257}, int64_t{32000}}) {
      const std::vector<float> z = normal(n * M, 1, 1.0f), wte = normal(V * M, 2, 0.5f);
      std::vector<int32_t> targets(static_cast<size_t>(n));
      Rng rng(5, static_cast<uint64_t>(V));
      for (auto& y : targets) y = static_cast<int32_t>(rng.next_u32() % V);
      targets[0] = 0;
      targets[1] = static_cast<int32_t>(V - 1);  // the first and the last rank's rows
      const float scale = 1.0f / static_cast<float>(n);
      // The unsplit head: one rank holding every row (tp over a group of one).
      TensorParallel one(self->comm(Group::kMp));
      const Head want = run_head(one, vocab_shard(V, 1, 0), z, wte, targets, n, M, scale);
      const VocabShard shard = vocab_shard(V, mp, mpc.rank());
      const Head got = run_head(tp, shard, z, wte, targets, n, M, scale);
      const std::string what = fmt::format("V {} mp {} rank {}", V, mp, mpc.rank());
      EXPECT_LE(std::fabs(got.loss - want.loss) / std::fabs(want.loss), kTol) << what;
      EXPECT_LE(rel_err(got.dz.data(), want.dz.data(), n * M), kTol) << what << ": dz";
      EXPECT_LE(rel_err(got.dwte.data(), want.dwte.data() + shard.begin * M, shard.size() * M),
                kTol)
          << what << ": dwte rows [" << shard.begin << ", " << shard.end << ")";
      // The shards tile [0, V): each row on exactly one rank, sizes within one of each other.
      int64_t rows[2] = {shard.size(), shard.size()};
      mpc.allreduce(&rows[0], 1, ReduceOp::kSum);
      EXPECT_EQ(rows[0], V) << what;
      EXPECT_GE(shard.size(), V / mp) << what;
      EXPECT_LE(shard.size(), V / mp + 1) << what;
    }
  }
}

TEST(VocabParallel, EmbeddingSumsToTheUnsplitRowsBitForBit) {
  const int64_t B = 2, L = 5, M = 8, V = 257;
  std::vector<int32_t> tokens(static_cast<size_t>(B * L));
  Rng rng(9, 1);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u32() % V);
  tokens[3] = 0;
  tokens[4] = static_cast<int32_t>(V - 1);
  const std::vector<float> wte = normal(V * M, 3, 1.0f), wpe = normal(L * M, 4, 1.0f),
                           dout = normal(B * L * M, 5, 1.0f);
  std::vector<float> want(static_cast<size_t>(B * L * M)), dwte_want(static_cast<size_t>(V * M)),
      dwpe_want(static_cast<size_t>(L * M));
  embedding_forward(tokens.data(), wte.data(), wpe.data(), want.data(), B, L, M, V, 0, V);
  embedding_backward(tokens.data(), dout.data(), dwte_want.data(), dwpe_want.data(), B, L, M, 0,
                     V);
  for (int mp : mps()) {
    auto topo = test::make_topology(mp, 1, 1);
    TensorParallel tp(topo->comm(Group::kMp));
    const VocabShard s = vocab_shard(V, mp, topo->comm(Group::kMp).rank());
    std::vector<float> out(want.size()), dwte(static_cast<size_t>(s.size() * M)),
        dwpe(dwpe_want.size());
    embedding_forward(tokens.data(), wte.data() + s.begin * M, wpe.data(), out.data(), B, L, M, V,
                      s.begin, s.end);
    tp.g_forward(out.data(), B * L * M);
    embedding_backward(tokens.data(), dout.data(), dwte.data(), dwpe.data(), B, L, M, s.begin,
                       s.end);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), want.begin())) << "mp " << mp;
    EXPECT_TRUE(std::equal(dwte.begin(), dwte.end(), dwte_want.begin() + s.begin * M))
        << "mp " << mp;
    EXPECT_TRUE(std::equal(dwpe.begin(), dwpe.end(), dwpe_want.begin())) << "mp " << mp;
  }
}

// With one shard the three passes are cpu::cross_entropy_rows, bit for bit.
TEST(VocabParallel, OneShardIsCrossEntropyRowsBitForBit) {
  if (test::world_rank() != 0) return;
  const int64_t n = 7, V = 301;
  const std::vector<float> logits = normal(n * V, 6, 3.0f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) targets[static_cast<size_t>(r)] = static_cast<int32_t>(r * 41 % V);
  std::vector<float> d_want(logits.size()), d_got(logits.size()), row_max(n);
  std::vector<double> stats(static_cast<size_t>(2 * n));
  const double want = cpu::cross_entropy_rows(logits.data(), targets.data(), d_want.data(), n, V,
                                              0.25f);
  cpu::ce_row_max(logits.data(), n, V, row_max.data());
  cpu::ce_row_sums(logits.data(), row_max.data(), targets.data(), n, V, stats.data());
  const double got = cpu::ce_finish(logits.data(), row_max.data(), stats.data(), targets.data(),
                                    d_got.data(), n, V, 0.25f);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(std::equal(d_got.begin(), d_got.end(), d_want.begin()));
}

}  // namespace
}  // namespace parm::model
