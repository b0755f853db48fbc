#!/usr/bin/env bash
# train --shared-overlap on|off (parallel.shared_overlap; docs/spec.md §9): the shared experts
# computed while the dispatch AllToAll is in flight only move where their compute sits, so
# S1 and S2 at mp 2 (ep 2, where the AllToAll exists and is not fused) give the losses of
# the run without it bit for bit; the config key does what the flag does; a checkpoint saved
# with it on resumes with it off and the other way round (it is not in the model section);
# bad values, and the overlap without shared experts (train and the layer commands alike),
# are refused before any work; the refusals that hold for shared experts still hold with it.
#   bash train_shared_overlap.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

# The tiny GPT-2 MoE of train.sh with one shared expert.
cfg() {  # cfg <file> <extra "parallel" keys, e.g. , "shared_overlap": true>
  cat >"$1" <<JSON
{
  "name": "test-tiny-shared",
  "model": {"arch": "gpt2", "seq_len": 32, "model_dim": 64, "num_heads": 4, "num_layers": 2,
            "ffn_hidden": 128, "moe_every": 2, "experts": 4, "expert_hidden": 64, "topk": 2,
            "capacity_factor": "1.25", "seed": 3, "shared_experts": 1, "shared_hidden": 64},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 6, "micro_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 1},
  "parallel": {"mp": 2, "ep": 2, "esp": 1, "schedule": "s2"$2}
}
JSON
}
cfg "$tmp/cfg.json" ""
cfg "$tmp/cfg_on.json" ', "shared_overlap": true'

np=2  # ranks of train(): mp 2 x ep 2 in one MP group
train() { prun -n "$np" -- train "$@"; }

# same <a.jsonl> <b.jsonl> [first step]: every step's loss, l_aux and gradient norm equal bit
# for bit (from `first step` on), and the files share at least 3 steps.
same() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1
steps = sorted(s for s in a if s in b and s >= first)
diff = [(s, k, a[s][k], b[s][k]) for s in steps for k in ("loss", "aux_loss", "grad_norm")
        if a[s][k] != b[s][k]]
if len(steps) < 3 or diff:
    print(f"NOT bit-identical: {len(steps)} common steps; first differences {diff[:3]}")
    sys.exit(1)
print(f"bit-identical over steps {steps[0]}..{steps[-1]} (loss, aux_loss, grad_norm)")
PY
}

# (a) S1 and S2 at mp 2 ep 2 (2 ranks), fused and not: on equals off bit for bit, and the
# schedule names say where the overlap ran (ep 2, esp 1: the dispatch AllToAll is never fused;
# S2's combine is, with the MP AllGather: "s2+fused+shared-overlap").
for sched in s1 s2; do
  for fuse in on off; do
    name="--schedule $sched --fuse $fuse"
    out=$(train --config "$tmp/cfg.json" --schedule $sched --fuse $fuse \
          --metrics "$tmp/off_$sched$fuse.jsonl")
    check "(a) $name --shared-overlap off (default) runs" 0 $? "summary" "$out"
    grep -F "MoE schedules" <<<"$out" | grep -qF "shared-overlap" &&
      bad "(a) $name: the run without --shared-overlap names the overlap"
    out=$(train --config "$tmp/cfg.json" --schedule $sched --fuse $fuse --shared-overlap on \
          --metrics "$tmp/on_$sched$fuse.jsonl")
    check "(a) $name --shared-overlap on runs, overlapped" 0 $? "+shared-overlap" "$out"
    out=$(same "$tmp/on_$sched$fuse.jsonl" "$tmp/off_$sched$fuse.jsonl" 2>&1)
    check "(a) $name: on equals off ($out)" 0 $? "bit-identical" "$out"
  done
done

# (b) parallel.shared_overlap: true does what the flag does; --shared-overlap off overrides it.
out=$(train --config "$tmp/cfg_on.json" --metrics "$tmp/cfg_on.jsonl" --save-dir "$tmp/ck_on" \
      --save-every 3)
check "(b) parallel.shared_overlap: true runs overlapped" 0 $? "MoE schedules                s2+fused+shared-overlap" "$out"
out=$(same "$tmp/cfg_on.jsonl" "$tmp/on_s2on.jsonl" 2>&1)
check "(b) the config key equals the flag ($out)" 0 $? "bit-identical" "$out"
out=$(train --config "$tmp/cfg_on.json" --shared-overlap off --steps 1)
check "(b) --shared-overlap off overrides the config's true" 0 $? "summary" "$out"
grep -F "MoE schedules" <<<"$out" | grep -qF "shared-overlap" &&
  bad "(b) --shared-overlap off over the config's true still overlaps"

# (c) Checkpoints: saved with it on, resumed with it off, and the other way round, each equal
# to the uninterrupted run from the step after the checkpoint on.
out=$(train --config "$tmp/cfg.json" --resume "$tmp/ck_on/step-00000003" \
      --metrics "$tmp/res_off.jsonl")
check "(c) saved with --shared-overlap on, resumed off" 0 $? "summary" "$out"
out=$(same "$tmp/res_off.jsonl" "$tmp/off_s2on.jsonl" 4 2>&1)
check "(c) on -> off resume equals the full run ($out)" 0 $? "bit-identical" "$out"
out=$(train --config "$tmp/cfg.json" --save-dir "$tmp/ck_off" --save-every 3 --steps 3)
check "(c) a checkpoint saved with --shared-overlap off" 0 $? "summary" "$out"
out=$(train --config "$tmp/cfg.json" --resume "$tmp/ck_off/step-00000003" --shared-overlap on \
      --metrics "$tmp/res_on.jsonl")
check "(c) saved off, resumed with --shared-overlap on" 0 $? "+shared-overlap" "$out"
out=$(same "$tmp/res_on.jsonl" "$tmp/off_s2on.jsonl" 4 2>&1)
check "(c) off -> on resume equals the full run ($out)" 0 $? "bit-identical" "$out"

# (d) Refusals before any work (exit 2), naming what is valid.
refused() {  # refused <name> <text> <parmrun args...>
  local name="$1" text="$2"
  shift 2
  local out rc
  out="$(prun "$@")"
  rc=$?
  check "(d) $name" 2 $rc "$text" "$out"
}
need="--shared-overlap on (parallel.shared_overlap) needs shared experts: set --shared-experts N >= 1 (model.shared_experts), or --shared-overlap off"
refused "--shared-overlap maybe" "--shared-overlap (parallel.shared_overlap) 'maybe' is not valid; use on or off" \
  -n 1 -- train --config "$tmp/cfg.json" --mp 1 --ep 1 --shared-overlap maybe
cat >"$tmp/cfg_bad.json" <<JSON
{"model": {"shared_experts": 1, "shared_hidden": 64}, "parallel": {"shared_overlap": "on"}}
JSON
refused "parallel.shared_overlap \"on\"" "parallel.shared_overlap has the wrong type or is out of range: \"on\" (expected true or false)" \
  -n 1 -- train --config "$tmp/cfg_bad.json"
refused "train --shared-overlap on --shared-experts 0" "$need" \
  -n 2 -- train --config "$tmp/cfg.json" --shared-overlap on --shared-experts 0
refused "parallel.shared_overlap true with --shared-experts 0" "$need" \
  -n 2 -- train --config "$tmp/cfg_on.json" --shared-experts 0
refused "check-layer --shared-overlap on without shared experts" "$need" \
  -n 2 -- check-layer --ep 2 --tokens 32 --model-dim 16 --hidden 32 --experts 4 --shared-overlap on
refused "bench-layer --shared-overlap on without shared experts" "$need" \
  -n 2 -- bench-layer --ep 2 --tokens 32 --model-dim 16 --hidden 32 --experts 4 --shared-overlap on
# What is refused for shared experts is refused with the overlap on too.
refused "--device cuda with the overlap" "--shared-experts (model.shared_experts) 1 with --device cuda" \
  -n 2 -- train --config "$tmp/cfg_on.json" --device cuda

# (e) Under --pp 2 --pp-overlap on (4 ranks: two stages of mp 2 x ep 2; the pipeline's own
# interleaving at the AllToAlls), --recompute moe-act and --recompute moe (whose replay runs
# the shared experts again), the overlap runs and changes no bit.
for extra in "--pp 2 --grad-accum 2 --pp-overlap on" "--recompute moe-act" "--recompute moe"; do
  np=2
  [[ "$extra" == --pp* ]] && np=4
  out=$(train --config "$tmp/cfg.json" $extra --steps 3 --metrics "$tmp/e_off.jsonl")
  check "(e) $extra, --shared-overlap off" 0 $? "summary" "$out"
  out=$(train --config "$tmp/cfg.json" $extra --steps 3 --shared-overlap on \
        --metrics "$tmp/e_on.jsonl")
  check "(e) $extra, --shared-overlap on" 0 $? "summary" "$out"
  out=$(same "$tmp/e_on.jsonl" "$tmp/e_off.jsonl" 2>&1)
  check "(e) $extra: on equals off ($out)" 0 $? "bit-identical" "$out"
done

finish
