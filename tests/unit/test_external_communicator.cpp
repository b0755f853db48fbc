// The pieces of the torch.distributed backend that need no torch: the fixed summation
// orders (comm/block_sum.h) and ExternalCommunicator's deadline and counters over a fake
// library group (comm/external_communicator.h).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/block_sum.h"
#include "comm/external_communicator.h"
#include "parm/error.h"

namespace parm {
namespace {

// Values whose float sum depends on the order: 1e8 + 1 rounds to 1e8 (spacing 8).
const std::vector<float> kBlocks = {1e8f, 1.0f, -1e8f, 1.0f};

TEST(BlockSum, RankOrderIsLeftToRight) {
  float out = -1;
  sum_blocks_in_rank_order(DType::kF32, kBlocks.data(), &out, 1, 4);
  EXPECT_EQ(out, ((1e8f + 1.0f) + -1e8f) + 1.0f);
  EXPECT_EQ(out, 1.0f);
}

TEST(BlockSum, BinomialPairsThenPairsOfPairs) {
  std::vector<float> b = kBlocks;
  float out = -1;
  sum_blocks_binomial(DType::kF32, b.data(), &out, 1, 4);
  EXPECT_EQ(out, (1e8f + 1.0f) + (-1e8f + 1.0f));
  EXPECT_EQ(out, 0.0f);  // differs from the rank order: the order is what is tested
  // n = 3: (b0 + b1) + b2; n = 5: ((b0 + b1) + (b2 + b3)) + b4; several elements each.
  std::vector<double> d = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50};
  std::vector<double> r(2);
  sum_blocks_binomial(DType::kF64, d.data(), r.data(), 2, 5);
  EXPECT_EQ(r, (std::vector<double>{15, 150}));
  std::vector<int32_t> i = {7, 8, 9};
  int32_t s = 0;
  sum_blocks_binomial(DType::kI32, i.data(), &s, 1, 3);
  EXPECT_EQ(s, 24);
}

// A group of 2 whose operations never complete, or complete at once.
class FakeWork final : public ExternalWork {
 public:
  explicit FakeWork(bool completes) : completes_(completes) {}
  bool poll() override { return completes_; }
  bool wait_for(double seconds) override {
    if (completes_) return true;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 0.05)));
    return false;
  }

 private:
  bool completes_;
};

class FakeGroup final : public ExternalGroup {
 public:
  explicit FakeGroup(bool completes) : completes_(completes) {}
  int rank() const override { return 1; }
  int size() const override { return 2; }
  ExternalWorkPtr allreduce(void*, size_t, DType, ReduceOp) override { return work(); }
  ExternalWorkPtr allgather(const void*, void*, size_t, DType) override { return work(); }
  ExternalWorkPtr alltoall(const void*, void*, size_t, DType) override { return work(); }
  ExternalWorkPtr alltoallv(const void*, const size_t*, const size_t*, void*, const size_t*,
                            const size_t*, DType) override {
    return work();
  }
  ExternalWorkPtr send(const void*, size_t, DType, int, int) override { return work(); }
  ExternalWorkPtr recv(void*, size_t, DType, int, int) override { return work(); }
  ExternalWorkPtr broadcast(void*, size_t, DType, int) override { return work(); }
  ExternalWorkPtr barrier() override { return work(); }

 private:
  ExternalWorkPtr work() { return std::make_unique<FakeWork>(completes_); }
  bool completes_;
};

TEST(ExternalCommunicator, StuckPeerBecomesTimeoutNamingRankGroupOpBytes) {
  ExternalCommunicator c(std::make_unique<FakeGroup>(false), "ep", 3, true, 0.2, "torch");
  std::vector<float> send(8), recv(8);
  RequestPtr r = c.ialltoall(send.data(), recv.data(), 4, DType::kF32);
  const auto start = std::chrono::steady_clock::now();
  try {
    r->wait();
    FAIL() << "wait returned";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 (group ep rank 1 of 2): alltoall of 32 bytes "
                                         "did not complete within 0.2 s"),
              std::string::npos)
        << e.what();
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 2.0);
  EXPECT_THROW(r->wait(), Timeout);  // a failed request stays failed
  EXPECT_EQ(c.stats().op(CommOp::kAllToAll).calls, 0);
}

TEST(ExternalCommunicator, CountsAsMpiDoes) {
  ExternalCommunicator c(std::make_unique<FakeGroup>(true), "mp", 0, true, 5.0, "torch");
  std::vector<float> buf(6), out(3);
  c.allreduce(buf.data(), 6, DType::kF32);              // 2 (n-1)/n B = 24
  c.reduce_scatter(buf.data(), out.data(), 3, DType::kF32);  // (n-1) B = 12
  c.barrier();
  EXPECT_EQ(c.stats().op(CommOp::kAllReduce).calls, 1);
  EXPECT_DOUBLE_EQ(c.stats().op(CommOp::kAllReduce).bus_bytes, 24.0);
  EXPECT_EQ(c.stats().op(CommOp::kReduceScatter).calls, 1);
  EXPECT_DOUBLE_EQ(c.stats().op(CommOp::kReduceScatter).bus_bytes, 12.0);
  EXPECT_EQ(c.stats().op(CommOp::kAllToAll).calls, 0);  // its alltoall is not counted apart
  EXPECT_EQ(c.stats().op(CommOp::kAllGather).calls, 0);
  EXPECT_EQ(c.stats().op(CommOp::kBarrier).calls, 1);
  EXPECT_STREQ(c.backend(), "torch");
}

}  // namespace
}  // namespace parm
