// Runs a step's micro-batches through this rank's pipeline stage under the 1F1B schedule
// (train/pipeline_schedule.h): activations go forward and their gradients back as
// point-to-point messages on the pp group's host communicator (counted as pp.send /
// pp.recv, bounded by its deadline). Receives are posted as soon as their buffer is free;
// sends never block the stage (waited before their buffer is reused).
//
// With `overlap` (--pp-overlap on) the stage runs the passes of overlap_groups() together:
// each pass stops where one of its MoE layers has an AllToAll in flight
// (Model::start_stage_forward), and the other pass of its group computes meanwhile; they
// take turns in a fixed order (the same on every rank of the stage, so that their
// collectives match) until both have ended. The result is bit-identical to the run without.
//
// Every stage of a pp group passes the same micro-batches (each rank reads them itself: the
// first stage needs the tokens, the last the targets).
#pragma once

#include <vector>

#include "model/model.h"
#include "train/pipeline_schedule.h"

namespace parm::train {

class PipelineRunner {
 public:
  // num_micro: micro-batches per step (--grad-accum); the model must have been built with
  // pipeline_slots(stage, p, num_micro) activation slots.
  PipelineRunner(Topology& topo, model::Model& model, int num_micro, bool overlap = false);

  // Forward and backward of every micro-batch (batches.size() == num_micro), accumulating
  // (+=) the stage's gradients (d, loss_scale: as Model::forward_backward).
  // Returns the stage's loss parts summed over the micro-batches: the lm loss on the last
  // stage, the l_aux of its own MoE layers on every stage.
  model::LossParts run(const std::vector<model::Batch>& batches,
                       const model::LossDenominators& d, float loss_scale);
  // Forward only of one micro-batch through all stages (evaluation); loss parts as run().
  model::LossParts forward(const model::Batch& batch);

  // Wall time the last run() spent waiting for pp.recv (the stage idle: the bubble).
  double last_recv_wait_us() const { return recv_wait_us_; }
  // Time the last run()'s MoE layers spent in their collectives (posting and waiting; not
  // the other pass's compute while an AllToAll was in flight).
  double last_moe_comm_us() const { return moe_comm_us_; }
  // Pieces of passes the last run() ran while another pass had an AllToAll in flight (0
  // without overlap, or where no MoE layer of the stage has an AllToAll).
  int last_overlapped_pieces() const { return overlapped_pieces_; }
  const std::vector<PipeStep>& steps() const { return steps_; }
  // The passes run together (singles without overlap), indices into steps().
  const std::vector<std::vector<int>>& groups() const { return groups_; }

 private:
  // Waits for r (when set), the receive of step st, and counts the wait as idle time. A
  // Timeout is rethrown naming the rank and stage that did not send.
  void wait_recv(RequestPtr& r, const PipeStep& st);
  struct StepRequests;  // the run's point-to-point requests, by slot
  // Waits for what step st needs and starts its pass (split under overlap): true while the
  // pass is stopped with an AllToAll in flight.
  bool start(const PipeStep& st, const model::Batch& batch, StepRequests& rq);
  // After st's pass has ended: its loss parts, its sends, and the receives it frees.
  void finish(const PipeStep& st, StepRequests& rq, model::LossParts& total);

  Communicator& pp_;
  model::Model& model_;
  model::StageBlocks stage_;
  int num_micro_ = 1;
  int slots_ = 1;
  bool overlap_ = false;
  std::vector<PipeStep> steps_;
  std::vector<std::vector<int>> groups_;
  std::vector<int> peer_world_rank_;  // by stage: the world rank of this rank's pp peer
  std::vector<Tensor> dy_;       // by slot: the incoming output gradient (T, M)
  std::vector<Tensor> dx_send_;  // by slot: the outgoing input gradient (T, M)
  double recv_wait_us_ = 0.0;
  double moe_comm_us_ = 0.0;
  int overlapped_pieces_ = 0;
  // The current run()'s arguments.
  model::LossDenominators denominators_;
  float loss_scale_ = 0.0f;
};

}  // namespace parm::train
