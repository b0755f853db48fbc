// The 1F1B schedule as data: hand-written lists, the in-flight bound that sizes the
// activation slots, and a simulation of all stages together (every stage blocked on its
// neighbours as the trainer is) that must finish, with the bubble 1F1B promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "parm/error.h"
#include "train/pipeline_schedule.h"

namespace parm::train {
namespace {

TEST(PipelineSchedule, HandWrittenLists) {
  // p = 4, m = 6: stage 0 warms up with 3 forwards, stage 3 alternates from the start.
  EXPECT_EQ(steps_str(one_f_one_b(0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(steps_str(one_f_one_b(1, 4, 6)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(steps_str(one_f_one_b(3, 4, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(steps_str(one_f_one_b(0, 4, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(steps_str(one_f_one_b(2, 4, 2)), "F0 F1 B0 B1");
  // One stage: forward_backward per micro-batch, as without a pipeline.
  EXPECT_EQ(steps_str(one_f_one_b(0, 1, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(pipeline_slots(0, 4, 6), 4);
  EXPECT_EQ(pipeline_slots(3, 4, 6), 1);
  EXPECT_EQ(pipeline_slots(0, 4, 2), 2);
}

TEST(PipelineSchedule, BadArgumentsAreRefused) {
  EXPECT_THROW(one_f_one_b(4, 4, 2), InvalidConfig);
  EXPECT_THROW(one_f_one_b(-1, 4, 2), InvalidConfig);
  EXPECT_THROW(one_f_one_b(0, 2, 0), InvalidConfig);
}

// Every micro-batch forwarded then backwarded once, in order; the slot of a micro-batch is
// never reused while it is in flight, and no more than `slots` are.
TEST(PipelineSchedule, SlotsAreNeverSharedInFlight) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < p; ++s) {
        const auto steps = one_f_one_b(s, p, m);
        const int slots = pipeline_slots(s, p, m);
        ASSERT_EQ(static_cast<int>(steps.size()), 2 * m);
        std::map<int, int> holder;  // slot -> micro-batch in flight there
        int next_f = 0, next_b = 0, max_in_flight = 0;
        for (const PipeStep& st : steps) {
          ASSERT_EQ(st.slot, st.micro % slots);
          ASSERT_LT(st.slot, slots);
          if (st.op == PipeOp::kForward) {
            ASSERT_EQ(st.micro, next_f++);
            ASSERT_EQ(holder.count(st.slot), 0u)
                << "p " << p << " m " << m << " stage " << s << ": slot " << st.slot
                << " reused by F" << st.micro << " while in flight";
            holder[st.slot] = st.micro;
          } else {
            ASSERT_EQ(st.micro, next_b++);
            ASSERT_EQ(holder.at(st.slot), st.micro);
            holder.erase(st.slot);
          }
          max_in_flight = std::max(max_in_flight, static_cast<int>(holder.size()));
        }
        EXPECT_EQ(max_in_flight, slots) << "p " << p << " m " << m << " stage " << s;
      }
}

// All stages run their lists; F(s, i) waits for F(s-1, i), B(s, i) for B(s+1, i). With a
// forward taking 1 and a backward 2 everywhere, the run must end (no stage waits on a
// message its neighbour sends only later in its list) and each stage idles for the share
// (p - 1) / (m + p - 1) of the step.
TEST(PipelineSchedule, AllStagesTogetherFinishWithTheOneFOneBBubble) {
  const double kF = 1.0, kB = 2.0;
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 10; ++m) {
      std::vector<std::vector<PipeStep>> lists;
      for (int s = 0; s < p; ++s) lists.push_back(one_f_one_b(s, p, m));
      std::vector<size_t> next(static_cast<size_t>(p), 0);
      std::vector<double> free_at(static_cast<size_t>(p), 0.0);
      std::map<std::tuple<int, int, int>, double> done;  // (op, stage, micro) -> end time
      bool progress = true;
      while (progress) {
        progress = false;
        for (int s = 0; s < p; ++s) {
          auto& i = next[static_cast<size_t>(s)];
          if (i == lists[static_cast<size_t>(s)].size()) continue;
          const PipeStep& st = lists[static_cast<size_t>(s)][i];
          const bool fwd = st.op == PipeOp::kForward;
          double ready = free_at[static_cast<size_t>(s)];
          const int peer = fwd ? s - 1 : s + 1;
          if (peer >= 0 && peer < p) {
            auto it = done.find({fwd ? 0 : 1, peer, st.micro});
            if (it == done.end()) continue;  // blocked on the neighbour
            ready = std::max(ready, it->second);
          }
          const double end = ready + (fwd ? kF : kB);
          done[{fwd ? 0 : 1, s, st.micro}] = end;
          free_at[static_cast<size_t>(s)] = end;
          ++i;
          progress = true;
        }
      }
      for (int s = 0; s < p; ++s)
        ASSERT_EQ(next[static_cast<size_t>(s)], lists[static_cast<size_t>(s)].size())
            << "p " << p << " m " << m << ": stage " << s << " deadlocked at step "
            << next[static_cast<size_t>(s)];
      const double makespan = *std::max_element(free_at.begin(), free_at.end());
      const double idle = 1.0 - m * (kF + kB) / makespan;
      EXPECT_NEAR(idle, one_f_one_b_bubble(p, m), 1e-12) << "p " << p << " m " << m;
    }
}

TEST(PipelineSchedule, OverlapGroupsHandWritten) {
  // p = 4, m = 6: stage 0 pairs its 3 warm-up forwards two by two, then each forward with the
  // backward after it; the last stage pairs nothing.
  EXPECT_EQ(groups_str(one_f_one_b(0, 4, 6), overlap_groups(0, 4, 6)),
            "F0+F1 F2 F3+B0 F4+B1 F5+B2 B3 B4 B5");
  EXPECT_EQ(groups_str(one_f_one_b(1, 4, 6), overlap_groups(1, 4, 6)),
            "F0+F1 F2+B0 F3+B1 F4+B2 F5+B3 B4 B5");
  EXPECT_EQ(groups_str(one_f_one_b(2, 4, 6), overlap_groups(2, 4, 6)),
            "F0 F1+B0 F2+B1 F3+B2 F4+B3 F5+B4 B5");
  EXPECT_EQ(groups_str(one_f_one_b(3, 4, 6), overlap_groups(3, 4, 6)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: the forwards in pairs, the backwards alone.
  EXPECT_EQ(groups_str(one_f_one_b(0, 4, 3), overlap_groups(0, 4, 3)), "F0+F1 F2 B0 B1 B2");
  EXPECT_EQ(groups_str(one_f_one_b(0, 1, 2), overlap_groups(0, 1, 2)), "F0 B0 F1 B1");
}

// The overlap's groups cover the list once, in order; a group never holds two backwards, one
// micro-batch twice or one slot twice; and all stages together finish even when a group's
// passes wait for every input before any of them sends (the second pass's input is waited
// for while the first is unfinished).
TEST(PipelineSchedule, OverlapGroupsAreSafe) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 10; ++m) {
      std::vector<std::vector<PipeStep>> lists;
      std::vector<std::vector<std::vector<int>>> groups;
      for (int s = 0; s < p; ++s) {
        lists.push_back(one_f_one_b(s, p, m));
        groups.push_back(overlap_groups(s, p, m));
        int expect = 0;
        for (const auto& g : groups.back()) {
          ASSERT_GE(g.size(), 1u);
          ASSERT_LE(g.size(), 2u);
          for (int j : g) ASSERT_EQ(j, expect++) << "p " << p << " m " << m << " stage " << s;
          if (g.size() == 2) {
            const PipeStep& a = lists.back()[static_cast<size_t>(g[0])];
            const PipeStep& b = lists.back()[static_cast<size_t>(g[1])];
            EXPECT_FALSE(a.op == PipeOp::kBackward && b.op == PipeOp::kBackward);
            EXPECT_NE(a.micro, b.micro);
            EXPECT_NE(a.slot, b.slot);
          }
        }
        ASSERT_EQ(expect, 2 * m);
      }
      std::vector<size_t> next(static_cast<size_t>(p), 0);
      std::map<std::tuple<int, int, int>, bool> done;  // (op, stage, micro) sent
      bool progress = true;
      while (progress) {
        progress = false;
        for (int s = 0; s < p; ++s) {
          auto& i = next[static_cast<size_t>(s)];
          const auto& gs = groups[static_cast<size_t>(s)];
          if (i == gs.size()) continue;
          bool ready = true;
          for (int j : gs[i]) {
            const PipeStep& st = lists[static_cast<size_t>(s)][static_cast<size_t>(j)];
            const bool fwd = st.op == PipeOp::kForward;
            const int peer = fwd ? s - 1 : s + 1;
            if (peer >= 0 && peer < p && !done.count({fwd ? 0 : 1, peer, st.micro}))
              ready = false;
          }
          if (!ready) continue;
          for (int j : gs[i]) {
            const PipeStep& st = lists[static_cast<size_t>(s)][static_cast<size_t>(j)];
            done[{st.op == PipeOp::kForward ? 0 : 1, s, st.micro}] = true;
          }
          ++i;
          progress = true;
        }
      }
      for (int s = 0; s < p; ++s)
        ASSERT_EQ(next[static_cast<size_t>(s)], groups[static_cast<size_t>(s)].size())
            << "p " << p << " m " << m << ": stage " << s << " deadlocked at group "
            << next[static_cast<size_t>(s)];
    }
}

}  // namespace
}  // namespace parm::train
