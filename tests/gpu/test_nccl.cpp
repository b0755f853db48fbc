// The NCCL communicator (src/comm/cuda/nccl_communicator.h) in one process: every group is
// MPI_COMM_SELF, so NCCL runs at size 1 and every result is exactly predictable (the sum
// of one block is the block; a gather of one is a copy). What this checks: NCCL comes up,
// every op moves the right bytes to the right place on the compute stream, requests and
// events complete and are recycled, refusals say why, the counters match the MPI
// backend's rules, the fused collectives at size-1 groups equal the plain ops (also with
// fused_plan::KeepSizeOneStages, which runs every stage on its own stream with NCCL
// send/recv to self, so the stage-to-stage event chaining and the peer messages run on one
// GPU), many fused calls in a row never read an unfinished timer, the watchdog turns an
// operation that cannot complete into parm::Timeout, and the two kernels (rank-ordered
// block sum, MP interleave) match their CPU definitions bit for bit at sizes the GPU does
// not need peers for. Multi-rank behaviour needs several GPUs.
//
// Needs MPI initialised (the GPU test binary's main) and skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/cuda/nccl_communicator.h"
#include "comm/cuda/nccl_kernels.h"
#include "comm/fused.h"
#include "comm/fused_plan.h"
#include "comm/mpi_communicator.h"
#include "kernels/cuda/runtime.h"
#include "parm/comm.h"
#include "parm/device.h"
#include "parm/error.h"

namespace parm {
namespace {

// ---- device memory of the test ----

template <typename T> class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n), p_(static_cast<T*>(device_alloc(n * sizeof(T)))) {}
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { device_free(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    device_copy(p_, host.data(), n_ * sizeof(T));
  }
  std::vector<T> download() const {  // waits for the compute stream first
    std::vector<T> host(n_);
    device_copy(host.data(), p_, n_ * sizeof(T));
    return host;
  }

 private:
  size_t n_;
  T* p_;
};

template <typename T> bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Floats of mixed sign and magnitude: their sum depends on the order it is taken in.
float random_float(uint64_t seed) {
  const uint64_t h = mix(seed);
  const float unit = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  return std::ldexp(unit, static_cast<int>((h >> 8) % 24) - 12);
}

// Small integers, exact in every dtype: element i of a payload tagged `tag`.
template <typename T> std::vector<T> payload(size_t n, int tag) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>((tag * 31 + static_cast<int>(i) * 7) % 101);
  return v;
}

// ---- communicators over MPI_COMM_SELF ----

std::unique_ptr<MpiCommunicator> self_host(const char* name, double timeout_s = 60.0) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_SELF, &c);  // the MpiCommunicator frees it
  return std::make_unique<MpiCommunicator>(c, name, /*intra_node=*/true, timeout_s);
}

class Nccl : public testing::Test {
 protected:
  static void TearDownTestSuite() {
    ep_.reset();
    esp_.reset();
    mp_.reset();
    ep_host_.reset();
    esp_host_.reset();
    mp_host_.reset();
  }
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
    if (ep_ == nullptr) {
      ep_host_ = self_host("ep");
      esp_host_ = self_host("esp");
      mp_host_ = self_host("mp");
      ep_ = std::make_unique<NcclCommunicator>(*ep_host_);
      esp_ = std::make_unique<NcclCommunicator>(*esp_host_);
      mp_ = std::make_unique<NcclCommunicator>(*mp_host_);
    }
    ep_->stats().reset();
    esp_->stats().reset();
    mp_->stats().reset();
  }

  static inline std::unique_ptr<MpiCommunicator> ep_host_, esp_host_, mp_host_;
  static inline std::unique_ptr<NcclCommunicator> ep_, esp_, mp_;
};

// calls and bus bytes of one op on `c`.
void expect_stats(Communicator& c, CommOp op, int64_t calls, double bus) {
  const OpStats& s = c.stats().op(op);
  EXPECT_EQ(s.calls, calls) << c.name() << " " << comm_op_name(op);
  EXPECT_DOUBLE_EQ(s.bus_bytes, bus) << c.name() << " " << comm_op_name(op);
  EXPECT_GE(s.time_us, 0.0) << c.name() << " " << comm_op_name(op);
}

// ---- identity ----

TEST_F(Nccl, IdentityAndCountersComeFromTheHost) {
  EXPECT_EQ(ep_->name(), "ep");
  EXPECT_EQ(ep_->rank(), 0);
  EXPECT_EQ(ep_->size(), 1);
  EXPECT_TRUE(ep_->intra_node());
  EXPECT_DOUBLE_EQ(ep_->timeout_s(), 60.0);
  EXPECT_EQ(&ep_->stats(), &ep_host_->stats());
  EXPECT_TRUE(is_nccl(*ep_));
  EXPECT_FALSE(is_nccl(*ep_host_));
  EXPECT_FALSE(ep_->aborted());
  EXPECT_NE(ep_->nccl_comm(), nullptr);
}

// ---- collectives, every dtype ----

template <typename T> void check_allreduce(NcclCommunicator& c) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    const auto want = payload<T>(13, static_cast<int>(op));
    DeviceArray<T> buf(want);
    c.allreduce(buf.get(), buf.size(), op);
    EXPECT_TRUE(bitwise_equal(buf.download(), want)) << dtype_name(dtype_of<T>());
  }
}

TEST_F(Nccl, AllReduceEveryDtypeAndOp) {
  check_allreduce<float>(*ep_);
  check_allreduce<double>(*ep_);
  check_allreduce<int32_t>(*ep_);
  check_allreduce<int64_t>(*ep_);
  check_allreduce<uint8_t>(*ep_);
  expect_stats(*ep_, CommOp::kAllReduce, 15, 0.0);  // 2 (n-1)/n * B = 0 on one rank
  DeviceArray<float> empty(1);
  ep_->allreduce(empty.get(), 0, DType::kF32);  // count 0: nothing to move, still one call
  expect_stats(*ep_, CommOp::kAllReduce, 16, 0.0);
}

template <typename T> void check_allgather(NcclCommunicator& c) {
  const auto want = payload<T>(9, 3);
  DeviceArray<T> send(want), recv(want.size());
  c.allgather(send.get(), recv.get(), want.size());
  EXPECT_TRUE(bitwise_equal(recv.download(), want)) << dtype_name(dtype_of<T>());
  DeviceArray<T> inplace(want);  // send == recv + rank * count
  c.allgather(inplace.get(), inplace.get(), want.size());
  EXPECT_TRUE(bitwise_equal(inplace.download(), want)) << dtype_name(dtype_of<T>());
}

TEST_F(Nccl, AllGatherEveryDtypeAndInPlace) {
  check_allgather<float>(*ep_);
  check_allgather<double>(*ep_);
  check_allgather<int32_t>(*ep_);
  check_allgather<int64_t>(*ep_);
  check_allgather<uint8_t>(*ep_);
  expect_stats(*ep_, CommOp::kAllGather, 10, 0.0);
}

template <typename T> void check_reduce_scatter(NcclCommunicator& c) {
  const auto want = payload<T>(11, 4);
  DeviceArray<T> send(want), recv(want.size());
  c.reduce_scatter(send.get(), recv.get(), want.size());
  EXPECT_TRUE(bitwise_equal(recv.download(), want)) << dtype_name(dtype_of<T>());
  // recv may be send's own block.
  c.reduce_scatter(send.get(), send.get(), want.size());
  EXPECT_TRUE(bitwise_equal(send.download(), want)) << dtype_name(dtype_of<T>());
}

TEST_F(Nccl, ReduceScatterEveryDtypeAndInPlace) {
  check_reduce_scatter<float>(*ep_);
  check_reduce_scatter<double>(*ep_);
  check_reduce_scatter<int32_t>(*ep_);
  check_reduce_scatter<int64_t>(*ep_);
  check_reduce_scatter<uint8_t>(*ep_);
  expect_stats(*ep_, CommOp::kReduceScatter, 10, 0.0);
}

TEST_F(Nccl, AllToAllIsTheLocalCopyOnOneRank) {
  const auto want = payload<float>(17, 5);
  DeviceArray<float> send(want), recv(want.size());
  ep_->alltoall(send.get(), recv.get(), want.size());
  EXPECT_TRUE(bitwise_equal(recv.download(), want));
  const auto want64 = payload<int64_t>(4, 6);
  DeviceArray<int64_t> send64(want64), recv64(want64.size());
  ep_->alltoall(send64.get(), recv64.get(), want64.size());
  EXPECT_TRUE(bitwise_equal(recv64.download(), want64));
  expect_stats(*ep_, CommOp::kAllToAll, 2, 0.0);
  EXPECT_THROW(ep_->alltoall(send.get(), send.get(), want.size()), Error);  // overlap
}

TEST_F(Nccl, AllToAllvHonoursDisplacements) {
  const auto src = payload<int32_t>(12, 7);
  DeviceArray<int32_t> send(src);
  DeviceArray<int32_t> recv(std::vector<int32_t>(10, -1));
  const size_t sc[] = {7}, sd[] = {2}, rc[] = {7}, rd[] = {1};
  ep_->alltoallv(send.get(), sc, sd, recv.get(), rc, rd, DType::kI32);
  std::vector<int32_t> want(10, -1);
  for (size_t i = 0; i < 7; ++i) want[1 + i] = src[2 + i];
  EXPECT_EQ(recv.download(), want);
  expect_stats(*ep_, CommOp::kAllToAllv, 1, 0.0);  // nothing received from others
  const size_t bad_rc[] = {6};
  EXPECT_THROW(ep_->alltoallv(send.get(), sc, sd, recv.get(), bad_rc, rd, DType::kI32), Error);
}

TEST_F(Nccl, BarrierIsCounted) {
  ep_->barrier();
  ep_->barrier();
  expect_stats(*ep_, CommOp::kBarrier, 2, 0.0);
}

// ---- requests ----

TEST_F(Nccl, RequestsInFlightTogetherCompleteInAnyOrder) {
  const auto a = payload<float>(1000, 1), b = payload<float>(1000, 2);
  DeviceArray<float> da(a), db(b), ra(a.size()), rb(b.size());
  std::vector<RequestPtr> reqs;
  reqs.push_back(ep_->ialltoall(da.get(), ra.get(), a.size(), DType::kF32));
  reqs.push_back(ep_->ireduce_scatter(db.get(), rb.get(), b.size(), DType::kF32));
  reqs.push_back(ep_->iallreduce(da.get(), a.size(), DType::kF32, ReduceOp::kSum));
  reqs[2]->wait();  // the last one first: stream order completes the others with it
  EXPECT_TRUE(reqs[0]->test());
  EXPECT_TRUE(reqs[1]->test());
  wait_all(reqs);
  EXPECT_TRUE(bitwise_equal(ra.download(), a));
  EXPECT_TRUE(bitwise_equal(rb.download(), b));
  expect_stats(*ep_, CommOp::kAllToAll, 1, 0.0);
  expect_stats(*ep_, CommOp::kReduceScatter, 1, 0.0);
  expect_stats(*ep_, CommOp::kAllReduce, 1, 0.0);
}

TEST_F(Nccl, ManyRequestsRecycleEventsAndScratch) {
  const auto want = payload<float>(257, 9);
  DeviceArray<float> send(want), recv(want.size());
  for (int i = 0; i < 200; ++i) {
    auto r = ep_->ireduce_scatter(send.get(), recv.get(), want.size(), DType::kF32);
    if (i % 2 == 0) r->wait();  // the others complete in their destructor
  }
  EXPECT_TRUE(bitwise_equal(recv.download(), want));
  expect_stats(*ep_, CommOp::kReduceScatter, 200, 0.0);
}

// ---- point-to-point ----

TEST_F(Nccl, SendRecvToSelfInsideAGroupMatchInOrder) {
  const auto a = payload<float>(33, 1), b = payload<float>(33, 2);
  DeviceArray<float> da(a), db(b), x(a.size()), y(b.size());
  std::vector<RequestPtr> reqs;
  {
    NcclGroup group;
    reqs.push_back(ep_->irecv(x.get(), a.size(), DType::kF32, 0, 1));
    reqs.push_back(ep_->irecv(y.get(), b.size(), DType::kF32, 0, 2));
    reqs.push_back(ep_->isend(da.get(), a.size(), DType::kF32, 0, 1));
    reqs.push_back(ep_->isend(db.get(), b.size(), DType::kF32, 0, 2));
    EXPECT_FALSE(reqs[0]->test());       // nothing is queued before the group ends
    EXPECT_THROW(reqs[0]->wait(), Error);  // and waiting for it would never return
    group.end();
  }
  wait_all(reqs);
  EXPECT_TRUE(bitwise_equal(x.download(), a));  // first receive <- first send
  EXPECT_TRUE(bitwise_equal(y.download(), b));
  const double bytes = static_cast<double>(a.size() * sizeof(float));
  expect_stats(*ep_, CommOp::kSend, 2, 0.0);
  expect_stats(*ep_, CommOp::kRecv, 2, 2 * bytes);
}

TEST_F(Nccl, UncountedSendRecvCountNothing) {
  const auto a = payload<int32_t>(5, 3);
  DeviceArray<int32_t> da(a), x(a.size());
  std::vector<RequestPtr> reqs;
  {
    NcclGroup group;
    reqs.push_back(ep_->irecv_uncounted(x.get(), a.size(), DType::kI32, 0, kFusedTagBase));
    reqs.push_back(ep_->isend_uncounted(da.get(), a.size(), DType::kI32, 0, kFusedTagBase));
  }  // the destructor ends the group
  wait_all(reqs);
  EXPECT_EQ(x.download(), a);
  for (int op = 0; op < kNumCommOps; ++op)
    EXPECT_EQ(ep_->stats().op(static_cast<CommOp>(op)).calls, 0)
        << comm_op_name(static_cast<CommOp>(op));
}

TEST_F(Nccl, RefusalsSayWhy) {
  DeviceArray<float> buf(4);
  // A negative tag.
  {
    NcclGroup group;
    EXPECT_THROW(ep_->isend(buf.get(), 4, DType::kF32, 0, -1), Error);
  }
  // A peer outside the group.
  {
    NcclGroup group;
    EXPECT_THROW(ep_->irecv(buf.get(), 4, DType::kF32, 1, 0), Error);
  }
  // To itself outside a group: would block the stream forever.
  try {
    ep_->isend(buf.get(), 4, DType::kF32, 0, 0);
    ADD_FAILURE() << "a send to itself outside a group was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NcclGroup"), std::string::npos) << e.what();
  }
  // reduce_scatter inside a group: its sum would run before the exchange.
  {
    NcclGroup group;
    EXPECT_THROW(ep_->reduce_scatter(buf.get(), buf.get(), 4, DType::kF32), Error);
  }
  // Fused collectives inside a group.
  {
    NcclGroup group;
    EXPECT_THROW(nccl_fused_dispatch(*ep_, *esp_, buf.get(), buf.get(), 0, 1), Error);
  }
  // chunks < 1.
  DeviceArray<float> out(4);
  EXPECT_THROW(nccl_fused_dispatch(*ep_, *esp_, buf.get(), out.get(), 4, 0), InvalidConfig);
  EXPECT_THROW(nccl_fused_combine(*esp_, *ep_, buf.get(), out.get(), 4, 0), InvalidConfig);
  EXPECT_FALSE(nccl_group_open());
  EXPECT_FALSE(ep_->aborted());
  // The communicator still works after every refusal.
  const auto want = payload<float>(4, 8);
  buf.upload(want);
  ep_->allreduce(buf.get(), 4);
  EXPECT_TRUE(bitwise_equal(buf.download(), want));
}

// ---- the kernels against their CPU definitions ----

TEST_F(Nccl, OrderedBlockSumIsTheCpuSumBitForBit) {
  // (n, rows, block) blocks with strides, this rank's block elsewhere: the shape of the
  // fused combine's sum (rows = N_EP, a piece [lo, lo + len) of each block).
  const int n = 5, own_index = 2;
  const size_t rows = 3, block = 41, lo = 7, len = 29;
  const size_t row = rows * block;
  std::vector<float> blocks(n * row), own(n * row);
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i] = random_float(i);
    own[i] = random_float(i + (1u << 20));
  }
  std::vector<float> want(row, -1.0f);
  for (size_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < len; ++i) {
      const size_t off = r * block + lo + i;
      auto b = [&](int q) {
        return q == own_index ? own[own_index * row + off] : blocks[q * row + off];
      };
      float acc = b(0);
      for (int q = 1; q < n; ++q) acc += b(q);
      want[off] = acc;
    }
  DeviceArray<float> d_blocks(blocks), d_own(own), dst(std::vector<float>(row, -1.0f));
  cuda::ordered_block_sum(DType::kF32, d_blocks.get() + lo, row,
                          d_own.get() + own_index * row + lo, own_index, n, rows, block, len,
                          dst.get() + lo, block, cuda::stream());
  EXPECT_TRUE(bitwise_equal(dst.download(), want));

  // Another order gives another float sum here, so the check above has teeth.
  float reversed = 0.0f, forward = 0.0f;
  bool order_matters = false;
  for (size_t i = 0; i < len && !order_matters; ++i) {
    forward = blocks[lo + i];
    for (int q = 1; q < n; ++q) forward += blocks[q * row + lo + i];
    reversed = blocks[(n - 1) * row + lo + i];
    for (int q = n - 2; q >= 0; --q) reversed += blocks[q * row + lo + i];
    order_matters = forward != reversed;
  }
  EXPECT_TRUE(order_matters);
}

TEST_F(Nccl, OrderedBlockSumEveryDtype) {
  const int n = 4;
  const size_t count = 300;
  // u8 wraps mod 256; doubles of mixed magnitude.
  std::vector<uint8_t> u8(n * count);
  std::vector<double> f64(n * count);
  std::vector<int64_t> i64(n * count);
  for (size_t i = 0; i < u8.size(); ++i) {
    u8[i] = static_cast<uint8_t>(mix(i) & 0xff);
    f64[i] = static_cast<double>(random_float(i)) * std::ldexp(1.0, static_cast<int>(i % 40));
    i64[i] = static_cast<int64_t>(mix(i) >> 20) - (int64_t{1} << 42);
  }
  std::vector<uint8_t> want_u8(count);
  std::vector<double> want_f64(count);
  std::vector<int64_t> want_i64(count);
  for (size_t i = 0; i < count; ++i) {
    uint8_t a = u8[i];
    double d = f64[i];
    int64_t k = i64[i];
    for (int q = 1; q < n; ++q) {
      a = static_cast<uint8_t>(a + u8[q * count + i]);
      d += f64[q * count + i];
      k += i64[q * count + i];
    }
    want_u8[i] = a;
    want_f64[i] = d;
    want_i64[i] = k;
  }
  DeviceArray<uint8_t> du8(u8), ru8(count);
  DeviceArray<double> df64(f64), rf64(count);
  DeviceArray<int64_t> di64(i64), ri64(count);
  // own_index -1: every block from `blocks`.
  cuda::ordered_block_sum(DType::kU8, du8.get(), count, nullptr, -1, n, 1, 0, count, ru8.get(),
                          0, cuda::stream());
  cuda::ordered_block_sum(DType::kF64, df64.get(), count, nullptr, -1, n, 1, 0, count,
                          rf64.get(), 0, cuda::stream());
  cuda::ordered_block_sum(DType::kI64, di64.get(), count, nullptr, -1, n, 1, 0, count,
                          ri64.get(), 0, cuda::stream());
  EXPECT_EQ(ru8.download(), want_u8);
  EXPECT_TRUE(bitwise_equal(rf64.download(), want_f64));
  EXPECT_EQ(ri64.download(), want_i64);
}

TEST_F(Nccl, MpInterleaveIsTheCpuGather) {
  // out of 3 ranks seen as (outer 6, chunk 10) = (N_EP 2, block 30); piece [lo, lo + len)
  // of each EP block; full (outer, N_MP, chunk).
  const int n = 3, me = 1;
  const size_t n_ep = 2, block = 30, row = n_ep * block, chunk = 10, outer = row / chunk;
  const size_t lo = 4, len = 19;
  std::vector<float> stage(n * row), own(row);
  for (size_t i = 0; i < stage.size(); ++i) stage[i] = static_cast<float>(1000 + i);
  for (size_t i = 0; i < row; ++i) own[i] = static_cast<float>(-1.0 - static_cast<double>(i));
  std::vector<float> want(outer * n * chunk, 0.0f);
  for (size_t p = 0; p < n_ep; ++p)
    for (size_t i = 0; i < len; ++i) {
      const size_t x = p * block + lo + i;
      for (int q = 0; q < n; ++q)
        want[(x / chunk) * n * chunk + q * chunk + x % chunk] =
            q == me ? own[x] : stage[q * row + x];
    }
  DeviceArray<float> d_stage(stage), d_own(own), full(std::vector<float>(want.size(), 0.0f));
  cuda::mp_interleave(d_stage.get(), row, d_own.get(), me, n, n_ep, block, lo, len, chunk,
                      full.get(), cuda::stream());
  EXPECT_TRUE(bitwise_equal(full.download(), want));
}

// ---- fused collectives at size-1 groups: the plain ops, and nothing counted ----

constexpr size_t kBlocks[] = {0, 1, 37, 10007};
constexpr int kChunks[] = {1, 2, 5, 64};  // 64 > 37: empty pieces

// Every op of every group counted zero times (a group of one records nothing).
void expect_nothing_counted(std::initializer_list<Communicator*> comms) {
  for (Communicator* c : comms)
    for (int op = 0; op < kNumCommOps; ++op)
      EXPECT_EQ(c->stats().op(static_cast<CommOp>(op)).calls, 0)
          << c->name() << " " << comm_op_name(static_cast<CommOp>(op));
}

void check_fused_dispatch_at_size_one(NcclCommunicator& ep, NcclCommunicator& esp) {
  for (size_t block : kBlocks) {
    std::vector<float> in(block);
    for (size_t i = 0; i < block; ++i) in[i] = random_float(block * 131 + i);
    DeviceArray<float> d_in(in.empty() ? std::vector<float>{0.0f} : in);
    // The unfused pair on the device.
    DeviceArray<float> mid(block + 1), plain(block + 1);
    ep.alltoall(d_in.get(), mid.get(), block);
    esp.allgather(mid.get(), plain.get(), block);
    std::vector<float> want = plain.download();
    want.resize(block);
    EXPECT_TRUE(bitwise_equal(want, in)) << "block " << block;
    for (int chunks : kChunks) {
      ep.stats().reset();
      esp.stats().reset();
      DeviceArray<float> out(std::vector<float>(block + 1, -2.0f));
      nccl_fused_dispatch(ep, esp, d_in.get(), out.get(), block, chunks);
      std::vector<float> got = out.download();
      EXPECT_EQ(got[block], -2.0f) << "wrote past the end; block " << block;
      got.resize(block);
      EXPECT_TRUE(bitwise_equal(got, want)) << "block " << block << " chunks " << chunks;
      expect_nothing_counted({&ep, &esp});
    }
  }
}

TEST_F(Nccl, FusedDispatchAtSizeOneEqualsThePlainOps) {
  check_fused_dispatch_at_size_one(*ep_, *esp_);
}

TEST_F(Nccl, FusedDispatchWithSizeOneStagesKeptEqualsThePlainOps) {
  fused_plan::KeepSizeOneStages keep;
  check_fused_dispatch_at_size_one(*ep_, *esp_);
}

void check_fused_combine_at_size_one(NcclCommunicator& esp, NcclCommunicator& ep,
                                     NcclCommunicator& mp) {
  for (size_t block : {size_t{0}, size_t{1}, size_t{36}, size_t{10007}}) {
    std::vector<float> in(block);
    for (size_t i = 0; i < block; ++i) in[i] = random_float(block * 977 + i);
    DeviceArray<float> d_in(in.empty() ? std::vector<float>{0.0f} : in);
    DeviceArray<float> mid(block + 1), plain(block + 1);
    esp.reduce_scatter(d_in.get(), mid.get(), block);
    ep.alltoall(mid.get(), plain.get(), block);
    std::vector<float> want = plain.download();
    want.resize(block);
    EXPECT_TRUE(bitwise_equal(want, in)) << "block " << block;
    // outer * chunk = block: one row, or 4 rows of 9 (block 36).
    const int64_t outer = block == 36 ? 4 : 1;
    const int64_t chunk = static_cast<int64_t>(block) / outer;
    for (int chunks : kChunks) {
      for (int mode = 0; mode < 3; ++mode) {  // no MP part, MP into full, MP full == out
        SCOPED_TRACE(testing::Message() << "block " << block << " chunks " << chunks
                                        << " mode " << mode);
        ep.stats().reset();
        esp.stats().reset();
        mp.stats().reset();
        DeviceArray<float> out(std::vector<float>(block + 1, -2.0f));
        DeviceArray<float> full(std::vector<float>(block + 1, -3.0f));
        MpGatherPart part{&mp, outer, chunk, mode == 1 ? full.get() : out.get()};
        nccl_fused_combine(esp, ep, d_in.get(), out.get(), block, chunks,
                           mode == 0 ? nullptr : &part);
        std::vector<float> got = out.download();
        EXPECT_EQ(got[block], -2.0f) << "wrote past the end";
        got.resize(block);
        EXPECT_TRUE(bitwise_equal(got, want));
        if (mode == 1) {
          std::vector<float> f = full.download();
          EXPECT_EQ(f[block], -3.0f) << "wrote past the end";
          f.resize(block);
          EXPECT_TRUE(bitwise_equal(f, want));
        }
        expect_nothing_counted({&ep, &esp, &mp});
      }
    }
  }
}

TEST_F(Nccl, FusedCombineAtSizeOneEqualsThePlainOps) {
  check_fused_combine_at_size_one(*esp_, *ep_, *mp_);
}

TEST_F(Nccl, FusedCombineWithSizeOneStagesKeptEqualsThePlainOps) {
  fused_plan::KeepSizeOneStages keep;
  check_fused_combine_at_size_one(*esp_, *ep_, *mp_);
}

// The stage timers are read right after the compute stream joined the stages; a join that
// did not cover the `end` timing event made cudaEventElapsedTime find it unfinished
// (cudaErrorNotReady) in about one call in seven on an H200. Many calls, one to three
// stages, 1 to 8 pieces, each must complete; on communicators of this test only, so that a
// failure (which aborts them) leaves the fixture's alone.
TEST(NcclFused, ManyCallsInARowReadFinishedTimersOnly) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  auto ep_host = self_host("ep"), esp_host = self_host("esp"), mp_host = self_host("mp");
  NcclCommunicator ep(*ep_host), esp(*esp_host), mp(*mp_host);
  const size_t block = 4099;
  std::vector<float> in(block);
  for (size_t i = 0; i < block; ++i) in[i] = random_float(i + 17);
  DeviceArray<float> d_in(in), out(block), full(block);
  MpGatherPart part{&mp, 1, static_cast<int64_t>(block), full.get()};
  constexpr int kCalls = 3000;
  for (int i = 0; i < kCalls; ++i) {
    const int chunks = 1 + i % 8;
    std::optional<fused_plan::KeepSizeOneStages> keep;
    if (i % 3 != 0) keep.emplace();  // two or three stages; else one
    try {
      if (i % 2 == 0)
        nccl_fused_dispatch(ep, esp, d_in.get(), out.get(), block, chunks);
      else
        nccl_fused_combine(esp, ep, d_in.get(), out.get(), block, chunks, &part);
    } catch (const std::exception& e) {
      FAIL() << "call " << i << " of " << kCalls << " (chunks " << chunks << "): " << e.what();
    }
  }
  EXPECT_TRUE(bitwise_equal(out.download(), in));
  EXPECT_TRUE(bitwise_equal(full.download(), in));
}

TEST_F(Nccl, FusedCombineAcceptsAHostMpGroupOfOne) {
  // On one MP rank the MP part is a copy: its communicator need not be NCCL.
  const size_t block = 8;
  const auto in = payload<float>(block, 4);
  DeviceArray<float> d_in(in), out(block), full(block);
  MpGatherPart part{mp_host_.get(), 1, static_cast<int64_t>(block), full.get()};
  nccl_fused_combine(*esp_, *ep_, d_in.get(), out.get(), block, 2, &part);
  EXPECT_TRUE(bitwise_equal(out.download(), in));
  EXPECT_TRUE(bitwise_equal(full.download(), in));
}

// ---- the watchdog ----

// Holds a CUDA stream from the host: a host function queued on it spins until release(), so
// everything queued after it waits (no NCCL kernel is involved, so aborting a communicator
// leaves nothing of it running on the GPU). A thread of its own releases the stream after
// `bound` at the latest, so a test that waits for something behind the hold cannot hang.
class StreamHold {
 public:
  StreamHold(cudaStream_t stream, std::chrono::seconds bound) : stream_(stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &spin, &released_), cudaSuccess);
    releaser_ = std::thread([this, bound] {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait_for(lock, bound, [&] { return release_now_; });
      released_.store(true);
    });
  }
  // Releases, and waits until the stream has passed the hold.
  ~StreamHold() {
    release();
    releaser_.join();
    (void)cudaStreamSynchronize(stream_);
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() {
    {
      std::lock_guard<std::mutex> lock(m_);
      release_now_ = true;
    }
    cv_.notify_all();
  }

 private:
  static void CUDART_CB spin(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaStream_t stream_;
  std::atomic<bool> released_{false};
  std::mutex m_;
  std::condition_variable cv_;
  bool release_now_ = false;
  std::thread releaser_;
};

// An operation that cannot complete must end in parm::Timeout naming the group and op, with
// the communicator aborted. (NCCL refuses an unmatched receive from self at one rank, so the
// stand-in is a request whose event sits behind a held stream.) The hold is released 20
// deadlines after the call at the latest, far beyond any delay of the watchdog's polling:
// if the watchdog does not fire, wait() then returns normally and the test fails instead of
// hanging. (Should the abort wait for the device, that release also lets it finish.)
TEST(NcclWatchdog, AnOperationThatCannotCompleteTimesOutAndAborts) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  auto host = self_host("edp", /*timeout_s=*/1.0);
  auto comm = std::make_unique<NcclCommunicator>(*host);
  DeviceArray<float> buf(16);
  device_sync();
  bool timed_out = false;
  {
    StreamHold hold(cuda::stream(), std::chrono::seconds(20));
    // A count of 0 queues no NCCL work: the request is its event on the compute stream.
    RequestPtr r = comm->iallreduce(buf.get(), 0, DType::kF32, ReduceOp::kSum);
    try {
      r->wait();
      ADD_FAILURE() << "wait() returned: the watchdog did not fire within the bound";
    } catch (const Timeout& e) {
      timed_out = true;
      EXPECT_NE(std::string(e.what()).find("group edp"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected parm::Timeout, got: " << e.what();
    }
    hold.release();
  }  // the stream has passed the hold
  EXPECT_TRUE(timed_out);
  EXPECT_TRUE(comm->aborted());
  EXPECT_THROW(comm->barrier(), CommError);
  comm.reset();
}

}  // namespace
}  // namespace parm
