#!/usr/bin/env bash
# Pipeline-parallel training end to end (issue 21): (a) 10 steps under pp = 2 and 4 (with
# mp, esp, ep > 1 in some, one with pp innermost) follow the single-process losses within
# train.sh's tolerance and print the bubble against 1F1B's; (b) a run saved under pp 2
# resumes bit-exactly under pp 2 and on the single-process losses under pp 1 and pp 4; (c) a rank killed mid-job ends it
# with a message naming the rank and its stage; (d) a bad --pp-split is refused; (e)
# --pp-overlap on is bit-exact against off.
#   bash train_pp.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

# 4 blocks (MoE at 1 and 3) so that pp 4 holds one block per stage.
cat >"$tmp/cfg.json" <<JSON
{
  "name": "test-pp",
  "model": {"arch": "gpt2", "seq_len": 16, "model_dim": 32, "num_heads": 4, "num_layers": 4,
            "ffn_hidden": 64, "moe_every": 2, "experts": 4, "expert_hidden": 32, "topk": 2,
            "capacity_factor": "1.25", "seed": 5},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 10, "micro_batch": 2, "eval_every": 0, "eval_batches": 1, "log_every": 1},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON
train() { prun -n "$1" -- train --config "$tmp/cfg.json" "${@:2}"; }
compare() { python3 "$src/tests/cli/lib/compare_losses.py" "$@" 2>&1; }
tol=2e-4  # train.sh's: fp32 sums in another order

# (a) The single process accumulates the 4 micro-batches of each step. The last layout puts
# pp innermost (each stage on every other rank).
out=$(train 1 --grad-accum 4 --metrics "$tmp/ref.jsonl")
check "single-process reference" 0 $? "summary" "$out"
# "<ranks> <micro-batches per replica: 4 / N_DP> <layout>"
for layout in "2 4 --pp 2" "4 4 --pp 4" "4 4 --pp 2 --mp 2 --esp 2" "4 2 --pp 2 --ep 2" \
              "2 4 --pp 2 --pp-split 1,3" "4 4 --pp 2 --mp 2 --esp 2 --order pp-mp-esp-ep-dp"; do
  set -- $layout
  n=$1
  accum=$2
  shift 2
  out=$(train "$n" --grad-accum $accum "$@" --metrics "$tmp/run.jsonl")
  check "np$n $*: trains, prints the bubble" 0 $? "(1F1B " "$out"
  cmp=$(compare "$tmp/run.jsonl" "$tmp/ref.jsonl" $tol)
  check "np$n $*: follows the single process ($cmp)" 0 $? "max relative" "$cmp"
done

# (b) + (c): an uninterrupted pp 2 run; the same run with rank 1 (stage 1) killed as step 4
# (0-based) starts, after the step-3 checkpoint; resumed from it under pp 2, 1 and 4.
out=$(train 2 --pp 2 --grad-accum 4 --steps 6 --metrics "$tmp/full.jsonl")
check "pp 2 uninterrupted" 0 $? "summary" "$out"
out=$(PARM_FAULT=kill_rank=1,kill_at_step=4 train 2 --pp 2 --grad-accum 4 --steps 6 \
      --save-dir "$tmp/ck" --save-every 3)
rc=$?
# mpirun names the rank that died; the start of the log maps it to its stage.
check "(c) the killed rank ends the job, named" 1 $((rc != 0)) "process rank 1" "$out"
check "(c) ... and its stage" 1 $((rc != 0)) "pp stage 1 of 2 (world ranks 1)" "$out"
out=$(train 2 --pp 2 --grad-accum 4 --steps 6 --resume "$tmp/ck" --metrics "$tmp/r2.jsonl")
check "(b) resume under pp 2" 0 $? "resumed from" "$out"
cmp=$(compare "$tmp/r2.jsonl" "$tmp/full.jsonl" 0 4)
check "(b) resume under pp 2 is bit-exact ($cmp)" 0 $? "max relative" "$cmp"
for layout in "1" "4 --pp 4"; do
  set -- $layout
  out=$(train "$@" --grad-accum 4 --steps 6 --resume "$tmp/ck/step-00000003" --metrics "$tmp/rx.jsonl")
  check "(b) pp 2 checkpoint resumed on np$*" 0 $? "resumed from" "$out"
  cmp=$(compare "$tmp/rx.jsonl" "$tmp/full.jsonl" $tol 4)
  check "(b) np$*: steps 4..6 follow the pp 2 run ($cmp)" 0 $? "max relative" "$cmp"
done

# (d) A split that does not fit the 4 blocks.
out=$(train 2 --pp 2 --pp-split 3,3)
check "(d) --pp-split 3,3 refused" 1 $(($? != 0)) "--pp-split" "$out"

# (e) --pp-overlap on (two micro-batches' passes interleaved at their EP AllToAlls) gives the
# run without it bit for bit; the metrics line names the MoE collective time; a bad value is
# refused.
out=$(train 4 --pp 2 --ep 2 --grad-accum 4 --steps 4 --pp-overlap off --metrics "$tmp/ov0.jsonl")
check "(e) pp 2 x ep 2 without overlap" 0 $? "moe-comm " "$out"
out=$(train 4 --pp 2 --ep 2 --grad-accum 4 --steps 4 --pp-overlap on --metrics "$tmp/ov1.jsonl")
check "(e) pp 2 x ep 2 with overlap" 0 $? "moe-comm " "$out"
cmp=$(compare "$tmp/ov1.jsonl" "$tmp/ov0.jsonl" 0)
check "(e) the overlap is bit-exact ($cmp)" 0 $? "max relative" "$cmp"
out=$(train 2 --pp 2 --pp-overlap maybe)
check "(e) --pp-overlap maybe refused" 1 $(($? != 0)) "parallel.pp_overlap 'maybe' is not valid; use on or off" "$out"

finish
