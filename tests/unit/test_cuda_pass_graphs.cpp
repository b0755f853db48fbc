// The bookkeeping of the device experts' CUDA graphs (moe/cuda/pass_graphs.h) on the CPU:
// which passes run eagerly, which one is captured and which are replayed, as the keys come.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/cuda/pass_graphs.h"

namespace parm::moe::cuda {
namespace {

using Action = GraphPolicy::Action;

PassKey key(const void* p, int64_t slots, std::vector<int32_t> fills) {
  PassKey k;
  k.pointers = {p};
  k.sizes = {1, slots};
  k.fills = std::move(fills);
  return k;
}

std::string letters(GraphPolicy& g, const std::vector<PassKey>& keys, bool capture_ok = true) {
  std::string s;
  for (const PassKey& k : keys) {
    const Action a = g.next(k);
    s += a == Action::kEager ? 'E' : a == Action::kCapture ? 'C' : 'R';
    if (a == Action::kCapture) g.captured(capture_ok);
  }
  return s;
}

TEST(CudaPassGraphs, OffByDefaultAndEagerWhenOff) {
  GraphPolicy g;
  EXPECT_FALSE(g.enabled());
  int x = 0;
  const PassKey a = key(&x, 4, {1, 2});
  EXPECT_EQ(letters(g, {a, a, a}), "EEE");
  EXPECT_EQ(g.eager(), 3);
  EXPECT_EQ(g.captures(), 0);
}

TEST(CudaPassGraphs, SecondEqualPassIsCapturedAndLaterOnesReplayed) {
  GraphPolicy g;
  g.set_enabled(true);
  int x = 0, y = 0;
  const PassKey a = key(&x, 4, {1, 2}), b = key(&x, 4, {2, 1}), c = key(&y, 4, {1, 2});
  // Steady state: eager, capture, replays.
  EXPECT_EQ(letters(g, {a, a, a, a}), "ECRR");
  // Other fills, another tensor, other sizes: eager; the graph of a stays for a.
  EXPECT_EQ(letters(g, {b, c, key(&x, 5, {1, 2}), a}), "EEER");
  // A new steady state replaces the graph.
  EXPECT_EQ(letters(g, {b, b, b, a}), "ECRE");
  EXPECT_EQ(g.eager(), 1 + 3 + 2);
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.replays(), 2 + 1 + 1);
}

TEST(CudaPassGraphs, FailedCaptureTurnsGraphsOffForGood) {
  GraphPolicy g;
  g.set_enabled(true);
  int x = 0;
  const PassKey a = key(&x, 4, {3});
  EXPECT_EQ(letters(g, {a, a, a}, false), "ECE");
  EXPECT_FALSE(g.enabled());
  EXPECT_TRUE(g.capture_failed());
  g.set_enabled(true);  // stays off: the pass cannot be captured
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(letters(g, {a, a}), "EE");
}

TEST(CudaPassGraphs, TurningOffAndOnForgetsTheKeys) {
  GraphPolicy g;
  g.set_enabled(true);
  int x = 0;
  const PassKey a = key(&x, 4, {3});
  EXPECT_EQ(letters(g, {a, a, a}), "ECR");
  g.set_enabled(false);
  EXPECT_EQ(letters(g, {a}), "E");
  g.set_enabled(true);
  EXPECT_EQ(letters(g, {a, a, a}), "ECR");
}

}  // namespace
}  // namespace parm::moe::cuda
