#!/usr/bin/env bash
# --recompute (issue 39; docs/memory.md): (a) 30 steps of a small GPT-2 MoE model (BERT:
# train_recompute_bert.sh; the runs: lib/recompute_runs.bash) under each mode equal
# --recompute none bit for bit (losses, l_aux, gradient norm, every parameter and moment of
# the final checkpoint) under dp 2 (mp 1 ep 2), mp 2 ep 2 esp 2 dp 2 (8 ranks)
# and pp 2; (b) the measured activation bytes (the allocator's counters) drop by what each mode
# promises; (c) the dry-run prediction is within its tolerance of the measured peaks, and
# --memory-limit refuses a run that will not fit before any work.
#   bash train_recompute.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"
work="$tmp"

source "$(dirname "$0")/lib/recompute_runs.bash"
recompute_runs gpt2

# (c) The prediction against the measured peaks of the dp 2 runs (the last step's, max over
# ranks): parameters, gradients and optimizer state exact; activations within 2% (what the
# prediction leaves out: the movers' communication scratch); docs/memory.md.
for mode in none moe-act moe block; do
  name="gpt2-dp2-$mode"
  out=$(prun -n 2 -- train --config "$work/gpt2.json" --mp 1 --ep 2 --recompute $mode --dry-run-memory)
  echo "$out" | grep -q "stage 0:" || { bad "(c) $mode: no prediction"; echo "$out" | tail -5; continue; }
  got=$(python3 - "$work/$name.jsonl" "$out" <<'PY'
import json, re, sys
meas = json.loads(open(sys.argv[1]).readlines()[-1])["mem_peak_bytes"]
m = re.search(r"stage 0: .*\((\d+) bytes: parameters (\d+) gradients (\d+) optimizer (\d+) activations (\d+)", sys.argv[2])
p, g, o, a = (int(x) for x in m.groups()[1:])
ok = p == meas["parameters"] and g == meas["gradients"] and o == meas["optimizer"] and \
     abs(a - meas["activations"]) <= 0.02 * meas["activations"]
print(("ok" if ok else "bad") + f" predicted params {p} grads {g} optim {o} acts {a}; measured "
      f"{int(meas['parameters'])} {int(meas['gradients'])} {int(meas['optimizer'])} {int(meas['activations'])}")
PY
)
  case "$got" in ok*) ok "(c) $mode: ${got#ok }";; *) bad "(c) $mode: ${got#bad }";; esac
done
# (d) --recompute moe with shared experts (two, gated): the replay recomputes them too (their
# output buffer is a compute step's; their workspace stays the layer's), so the runs equal
# --recompute none bit for bit under S2 at dp 2 and fused S1 at mp 2 ep 2 esp 2 dp 2, and the
# prediction equals the measured peaks.
for layout in "dp2:2 --mp 1 --ep 2" "mp2:8 --mp 2 --ep 2 --esp 2 --schedule s1 --fuse on"; do
  tag="${layout%%:*}"
  set -- ${layout#*:}
  n=$1
  shift
  sh=(--shared-experts 2 --shared-hidden 32 --shared-gate on)
  train gpt2 "$n" "sh-$tag-none" "$@" "${sh[@]}" --recompute none &&
    train gpt2 "$n" "sh-$tag-moe" "$@" "${sh[@]}" --recompute moe ||
    { bad "(d) $tag: run failed"; tail -5 "$work/sh-$tag-moe.log"; continue; }
  if out=$(python3 "$src/tests/cli/lib/same_run.py" "$work/sh-$tag-moe.jsonl" "$work/sh-$tag-none.jsonl") &&
     out2=$(same_params "sh-$tag-moe" "sh-$tag-none"); then
    ok "(d) shared experts, $tag: moe = none: $out; $out2"
  else
    bad "(d) shared experts, $tag: moe differs from none: $out ${out2:-}"
  fi
  [ "$tag" = dp2 ] || continue
  out=$(prun -n 2 -- train --config "$work/gpt2.json" "$@" "${sh[@]}" --recompute moe --dry-run-memory)
  got=$(python3 - "$work/sh-$tag-moe.jsonl" "$out" <<'PY'
import json, re, sys
meas = json.loads(open(sys.argv[1]).readlines()[-1])["mem_peak_bytes"]
m = re.search(r"stage 0: .*\((\d+) bytes: parameters (\d+) gradients (\d+) optimizer (\d+) activations (\d+)", sys.argv[2])
p, g, o, a = (int(x) for x in m.groups()[1:])
ok = (p, g, o) == (meas["parameters"], meas["gradients"], meas["optimizer"]) and \
     abs(a - meas["activations"]) <= 0.02 * meas["activations"]
print(("ok" if ok else "bad") + f" predicted acts {a}, measured {int(meas['activations'])}")
PY
)
  case "$got" in ok*) ok "(d) shared experts, moe: ${got#ok }";; *) bad "(d) shared experts, moe: ${got#bad }";; esac
done

# (e) --recompute block and moe with --pp-overlap on (pp 2, 4 micro-batches: stage 0 runs
# pairs of passes together): each of the two passes in flight holds its own lane (block: a set
# of block activations and an MoE layer per block; moe: a set of the activation pool), so the
# runs equal --recompute none bit for bit, and the prediction (a set per lane on stage 0)
# equals the measured peaks.
ov=(--pp 2 --mp 1 --ep 2 --grad-accum 4 --pp-overlap on)
train gpt2 4 "ov-none" "${ov[@]}" --recompute none || { bad "(e) ov-none: run failed"; tail -5 "$work/ov-none.log"; }
for mode in block moe; do
if train gpt2 4 "ov-$mode" "${ov[@]}" --recompute $mode; then
  if out=$(python3 "$src/tests/cli/lib/same_run.py" "$work/ov-$mode.jsonl" "$work/ov-none.jsonl") &&
     out2=$(same_params "ov-$mode" "ov-none"); then
    ok "(e) $mode with --pp-overlap on = none: $out; $out2"
  else
    bad "(e) $mode with --pp-overlap on differs from none: $out ${out2:-}"
  fi
  out=$(prun -n 4 -- train --config "$work/gpt2.json" "${ov[@]}" --recompute $mode --dry-run-memory)
  got=$(python3 - "$work/ov-$mode.jsonl" "$out" <<'PY'
import json, re, sys
meas = json.loads(open(sys.argv[1]).readlines()[-1])["mem_peak_bytes"]["activations"]
stages = [int(a) for a in re.findall(r"stage \d+: .*activations (\d+)", sys.argv[2])]
pred = max(stages) if stages else -1
ok = len(stages) == 2 and abs(pred - meas) <= 0.02 * meas
print(("ok" if ok else "bad") + f" predicted activations per stage {stages}, measured (max over ranks) {int(meas)}")
PY
)
  case "$got" in ok*) ok "(e) $mode with --pp-overlap on: ${got#ok }";; *) bad "(e) $mode with --pp-overlap on: ${got#bad }";; esac
else
  bad "(e) $mode with --pp-overlap on: run failed"; tail -5 "$work/ov-$mode.log"
fi
done

out=$(prun -n 2 -- train --config "$work/gpt2.json" --mp 1 --ep 2 --memory-limit 1MiB --steps 1)
check "(c) --memory-limit 1MiB refuses the run before any work" 2 $? "will not fit --memory-limit" "$out"
grep -q "step " <<<"$out" && bad "(c) the refused run trained"
out=$(prun -n 2 -- train --config "$work/gpt2.json" --mp 1 --ep 2 --memory-limit 8x)
check "(c) --memory-limit 8x is refused" 2 $? "KiB, MiB, GiB" "$out"
out=$(prun -n 2 -- train --config "$work/gpt2.json" --mp 1 --ep 2 --recompute all)
check "(c) --recompute all is refused" 2 $? "use none, moe-act, moe or block" "$out"
finish
