// The 1F1B pipeline schedule (PipeDream-Flush, as Megatron-LM runs it) as data: the ordered
// list of forward and backward passes one stage runs over the m micro-batches of a step.
// The trainer executes the list (train/pipeline.cpp); the tests check it without MPI.
//
// Stage s of p runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one
// backward while forwards remain, then the remaining backwards (cool-down). Forwards and
// backwards each run in micro-batch order, so at most min(p - s, m) micro-batches are in
// flight on stage s (forwarded, not yet backwarded): that many activation slots are all the
// stage keeps, and micro-batch i uses slot i mod slots.
#pragma once

#include <string>
#include <vector>

namespace parm::train {

enum class PipeOp { kForward, kBackward };

struct PipeStep {
  PipeOp op = PipeOp::kForward;
  int micro = 0;  // micro-batch index in [0, m)
  int slot = 0;   // activation slot: micro mod pipeline_slots(stage, p, m)
};

// The steps of stage `stage` (0-based) of `num_stages`, for `num_micro` micro-batches.
// Throws InvalidConfig for stage outside [0, p) or num_micro < 1.
std::vector<PipeStep> one_f_one_b(int stage, int num_stages, int num_micro);

// Micro-batches in flight on a stage at most: min(p - stage, m).
int pipeline_slots(int stage, int num_stages, int num_micro);

// Passes of a stage that run together: 2 under --pp-overlap on with pipelining (pp > 1; the
// pipeline runs overlap_groups' pairs), else 1 (model::PipelineOptions::lanes).
int pipeline_lanes(int num_stages, const std::string& pp_overlap);

// 1F1B's idle share of a step when every forward and backward of every stage takes the same
// time: (p - 1) / (m + p - 1).
double one_f_one_b_bubble(int num_stages, int num_micro);

// "F0 F1 B0 F2 B1 B2" (tests, messages).
std::string steps_str(const std::vector<PipeStep>& steps);

// The overlap (--pp-overlap on): which passes of one_f_one_b(stage, p, m) run together, their
// MoE AllToAlls in flight while the other computes. Groups of indices into that list, in its
// order: the warm-up forwards two by two (F0+F1, F2+F3, ...), then, on every stage but the
// last, each steady-state forward with the backward after it (F(w+i)+B(i), w the warm-up
// count); the rest alone. Never two backwards (they share the stage's gradient scratch), and
// never a pair whose second pass waits for what the first sends: the last stage's F(i) B(i)
// are one micro-batch, and its B(i)+F(i+1) would wait for stage p-2's F(i+1), which that
// stage finishes only after B(i)'s gradient arrives.
std::vector<std::vector<int>> overlap_groups(int stage, int num_stages, int num_micro);

// "F0+F1 F2+B0 B1 ..." (tests, messages).
std::string groups_str(const std::vector<PipeStep>& steps,
                       const std::vector<std::vector<int>>& groups);

}  // namespace parm::train
