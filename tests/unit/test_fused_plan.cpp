// The description of the fused pipelines (src/comm/fused_plan.h): the stage order forced by
// the data flow, which stages a call drops, the counters each stage records, and the CUDA
// executor's record/wait order on its streams (checked here on the CPU, as data).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/fused_plan.h"
#include "parm/error.h"

namespace parm::fused_plan {
namespace {

struct Want {
  Role group;
  Work work;
  LinkClass link;
  CommOp records;
  Count count;
};

void expect_stages(Pipeline p, const std::vector<Want>& want) {
  const Description& d = describe(p);
  EXPECT_EQ(d.pipeline, p);
  ASSERT_EQ(d.num_stages, static_cast<int>(want.size())) << d.name;
  for (int j = 0; j < d.num_stages; ++j) {
    const Stage& s = d.stages[static_cast<size_t>(j)];
    const Want& w = want[static_cast<size_t>(j)];
    SCOPED_TRACE(testing::Message() << d.name << " stage " << j << " (" << s.name << ")");
    EXPECT_EQ(s.group, w.group);
    EXPECT_EQ(s.work, w.work);
    EXPECT_EQ(s.link, w.link);
    EXPECT_EQ(s.records, w.records);
    EXPECT_EQ(s.count, w.count);
    EXPECT_EQ(d.stage_of(s.group), j);
    // Neighbouring stages keep different link classes busy.
    if (j > 0) EXPECT_NE(s.link, d.stages[static_cast<size_t>(j - 1)].link);
  }
}

TEST(FusedPlan, StagesFollowTheDataFlow) {
  expect_stages(Pipeline::kDispatch,
                {{Role::kEp, Work::kEpAlltoall, LinkClass::kInterNode, CommOp::kAllToAll,
                  Count::kBlock},
                 {Role::kEsp, Work::kEspAllgather, LinkClass::kIntraNode, CommOp::kAllGather,
                  Count::kRow}});
  const Want exchange{Role::kEsp, Work::kEspExchange, LinkClass::kIntraNode,
                      CommOp::kReduceScatter, Count::kRow};
  const Want sum_alltoall{Role::kEp, Work::kEspSumEpAlltoall, LinkClass::kInterNode,
                          CommOp::kAllToAll, Count::kBlock};
  expect_stages(Pipeline::kCombine, {exchange, sum_alltoall});
  expect_stages(Pipeline::kCombineMp,
                {exchange, sum_alltoall,
                 {Role::kMp, Work::kMpGather, LinkClass::kIntraNode, CommOp::kAllGather,
                  Count::kRow}});
  EXPECT_EQ(describe(Pipeline::kCombine).stage_of(Role::kMp), -1);
}

std::vector<Work> works(const Plan& p) {
  std::vector<Work> w;
  for (int j = 0; j < p.num_stages; ++j) w.push_back(p.stage(j).work);
  return w;
}

TEST(FusedPlan, DropsStagesOfGroupsOfOneRankButTheEpAlltoall) {
  // sizes: N_EP, N_ESP, N_MP.
  EXPECT_EQ(works(make_plan(Pipeline::kDispatch, {1, 1, 1})),
            std::vector<Work>{Work::kEpAlltoall});
  EXPECT_EQ(works(make_plan(Pipeline::kDispatch, {2, 1, 1})),
            std::vector<Work>{Work::kEpAlltoall});
  EXPECT_EQ(works(make_plan(Pipeline::kDispatch, {1, 2, 1})),
            (std::vector<Work>{Work::kEpAlltoall, Work::kEspAllgather}));
  EXPECT_EQ(works(make_plan(Pipeline::kCombineMp, {1, 1, 1})),
            std::vector<Work>{Work::kEspSumEpAlltoall});
  EXPECT_EQ(works(make_plan(Pipeline::kCombineMp, {1, 1, 2})),
            (std::vector<Work>{Work::kEspSumEpAlltoall, Work::kMpGather}));
  const Plan all = make_plan(Pipeline::kCombineMp, {2, 3, 2});
  EXPECT_EQ(works(all),
            (std::vector<Work>{Work::kEspExchange, Work::kEspSumEpAlltoall, Work::kMpGather}));
  EXPECT_FALSE(all.self_messages);
  EXPECT_TRUE(all.runs(Role::kMp));
  EXPECT_FALSE(make_plan(Pipeline::kCombineMp, {2, 3, 1}).runs(Role::kMp));
  EXPECT_THROW(make_plan(Pipeline::kDispatch, {0, 1, 1}), Error);
}

TEST(FusedPlan, KeepSizeOneStagesKeepsEveryStageOnThisThreadWhileAlive) {
  {
    KeepSizeOneStages keep;
    const Plan p = make_plan(Pipeline::kCombineMp, {1, 1, 1});
    EXPECT_TRUE(p.self_messages);
    EXPECT_EQ(works(p),
              (std::vector<Work>{Work::kEspExchange, Work::kEspSumEpAlltoall, Work::kMpGather}));
    {
      KeepSizeOneStages nested;
      EXPECT_EQ(make_plan(Pipeline::kDispatch, {1, 1, 1}).num_stages, 2);
    }
    EXPECT_TRUE(make_plan(Pipeline::kDispatch, {1, 1, 1}).self_messages);  // still kept
  }
  const Plan p = make_plan(Pipeline::kDispatch, {1, 1, 1});
  EXPECT_FALSE(p.self_messages);
  EXPECT_EQ(p.num_stages, 1);
}

TEST(FusedPlan, EveryStageWorksOnEveryPieceInStepOrder) {
  for (int stages = 1; stages <= kMaxStages; ++stages)
    for (int chunks = 1; chunks <= 6; ++chunks) {
      std::vector<std::vector<int>> seen(static_cast<size_t>(stages));
      for (int s = 0; s < num_steps(stages, chunks); ++s)
        for (int j = 0; j < stages; ++j) {
          const int c = piece_at(s, j, chunks);
          if (c >= 0) seen[static_cast<size_t>(j)].push_back(c);
        }
      for (int j = 0; j < stages; ++j) {
        std::vector<int> want(static_cast<size_t>(chunks));
        for (int c = 0; c < chunks; ++c) want[static_cast<size_t>(c)] = c;
        EXPECT_EQ(seen[static_cast<size_t>(j)], want) << stages << " stages, " << chunks;
      }
    }
}

// The CUDA executor's issue order, replayed: per stage stream the ops in order, and for
// every wait the piece whose record it binds to (the latest record at the time of the call).
TEST(FusedPlan, StreamOrderJoinsEachStageOnItsLastRecord) {
  for (int stages = 1; stages <= kMaxStages; ++stages)
    for (int chunks = 1; chunks <= 9; ++chunks) {
      SCOPED_TRACE(testing::Message() << stages << " stages, " << chunks << " chunks");
      std::vector<std::vector<StreamOp>> stream(static_cast<size_t>(stages));
      std::vector<int> latest_done(static_cast<size_t>(stages), -1);
      std::vector<bool> joined(static_cast<size_t>(stages), false);
      std::vector<int> posted(static_cast<size_t>(stages), 0);
      for_each_stream_op(stages, chunks, [&](const StreamOp& o) {
        ASSERT_GE(o.stage, 0);
        ASSERT_LT(o.stage, stages);
        const size_t j = static_cast<size_t>(o.stage);
        if (o.kind == StreamOpKind::kJoin) {
          // The compute stream waits for `done`, which must be the stage's last record:
          // then `begin` and `end` have completed once the join has, and reading their
          // elapsed time cannot find them unfinished (cudaErrorNotReady).
          EXPECT_FALSE(joined[j]) << "stage " << j << " joined twice";
          joined[j] = true;
          const auto& ops = stream[j];
          ASSERT_FALSE(ops.empty());
          int last_record = -1;
          for (int i = 0; i < static_cast<int>(ops.size()); ++i)
            if (ops[static_cast<size_t>(i)].kind == StreamOpKind::kRecordBegin ||
                ops[static_cast<size_t>(i)].kind == StreamOpKind::kRecordEnd ||
                ops[static_cast<size_t>(i)].kind == StreamOpKind::kRecordDone)
              last_record = i;
          ASSERT_GE(last_record, 0);
          EXPECT_EQ(ops[static_cast<size_t>(last_record)].kind, StreamOpKind::kRecordDone)
              << "stage " << j << ": the joined event is not the last record on its stream";
          EXPECT_EQ(latest_done[j], chunks - 1);
          return;
        }
        EXPECT_FALSE(joined[j]) << "stage " << j << " issued work after its join";
        if (stream[j].empty())
          EXPECT_EQ(o.kind, StreamOpKind::kWaitStart) << "stage " << j << " starts early";
        switch (o.kind) {
          case StreamOpKind::kWaitPrevious:
            ASSERT_GT(o.stage, 0);
            EXPECT_EQ(latest_done[j - 1], o.piece)
                << "stage " << j << " piece " << o.piece << " waits for the wrong piece";
            break;
          case StreamOpKind::kPost:
            EXPECT_EQ(o.piece, posted[j]) << "stage " << j << " out of order";
            ++posted[j];
            break;
          case StreamOpKind::kRecordDone:
            EXPECT_EQ(o.piece, posted[j] - 1);
            latest_done[j] = o.piece;
            break;
          case StreamOpKind::kRecordBegin:
            EXPECT_EQ(posted[j], 0) << "begin after the first piece";
            break;
          case StreamOpKind::kRecordEnd:
            EXPECT_EQ(posted[j], chunks) << "end before the last piece";
            break;
          default: break;
        }
        stream[j].push_back(o);
      });
      for (int j = 0; j < stages; ++j) {
        EXPECT_TRUE(joined[static_cast<size_t>(j)]) << "stage " << j << " never joined";
        EXPECT_EQ(posted[static_cast<size_t>(j)], chunks);
        int begins = 0, ends = 0, previous_waits = 0;
        for (const StreamOp& o : stream[static_cast<size_t>(j)]) {
          begins += o.kind == StreamOpKind::kRecordBegin;
          ends += o.kind == StreamOpKind::kRecordEnd;
          previous_waits += o.kind == StreamOpKind::kWaitPrevious;
        }
        EXPECT_EQ(begins, 1);
        EXPECT_EQ(ends, 1);
        EXPECT_EQ(previous_waits, j > 0 ? chunks : 0);  // every piece waits for its input
      }
    }
}

}  // namespace
}  // namespace parm::fused_plan
