#!/usr/bin/env bash
# What each --recompute mode costs and saves (docs/memory.md): the same short training run of
# gpt2-moe-tiny under each mode, rounds interleaved (a change in the machine's load hits all
# alike), reporting the median over rounds of the mean step time (steps 1-2 skipped), its
# ratio to `none`, and the measured activation peak (max over ranks) and its saving; the
# modes' losses must equal none's bit for bit.
#   bench/recompute.sh [rounds=3] [steps=20] [train args...]
# Default: 4 ranks, the main job's layout (mp 2, ep 2, esp 2), schedule s1 fused.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-20}"
shift $(($# < 2 ? $# : 2))
read -r -a launch <<<"${LAUNCH:-$root/scripts/parmrun -n 4 --}"
args=(--mp 2 --ep 2 --esp 2)
[ $# -gt 0 ] && args=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
modes="none moe-act moe block"
for round in $(seq "$rounds"); do
  for mode in $modes; do
    "${launch[@]}" train --config gpt2-moe-tiny --steps "$steps" --eval-every 0 "${args[@]}" \
      --recompute $mode --metrics "$tmp/$mode.r$round.jsonl" >"$tmp/$mode.r$round.log" 2>&1 ||
      { tail -5 "$tmp/$mode.r$round.log"; exit 1; }
  done
done
python3 - "$tmp" "$rounds" "$modes" "${args[*]}" <<'PY'
import json, statistics, sys
tmp, rounds, modes, args = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
def load(mode, r):
    return [json.loads(l) for l in open(f"{tmp}/{mode}.r{r}.jsonl")]
ref = load("none", 1)
rows = {}
for mode in modes:
    runs = [load(mode, r) for r in range(1, rounds + 1)]
    for run in runs:
        if [x["loss"] for x in run] != [x["loss"] for x in ref]:
            sys.exit(f"{mode}: losses differ from none's")
    ms = statistics.median(statistics.mean(x["step_ms"] for x in run[2:]) for run in runs)
    acts = runs[0][-1]["mem_peak_bytes"]["activations"]
    total = runs[0][-1]["mem_peak_bytes"]["total"]
    rows[mode] = (ms, acts, total)
print(f"gpt2-moe-tiny, {args}, {rounds} rounds of {len(ref)} steps (median of the mean step "
      f"time over steps 3..)")
print("| --recompute | ms/step | time vs none | activations MiB | saved vs none | peak total MiB |")
print("|---|---|---|---|---|---|")
n_ms, n_acts, _ = rows["none"]
for mode in modes:
    ms, acts, total = rows[mode]
    print(f"| {mode} | {ms:.1f} | {ms / n_ms:.2f}x | {acts / 2**20:.2f} | "
          f"{(n_acts - acts) / 2**20:.2f} MiB ({100 * (n_acts - acts) / n_acts:.0f}%) | "
          f"{total / 2**20:.2f} |")
print("losses of every mode equal none's bit for bit")
PY
