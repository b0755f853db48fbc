#!/usr/bin/env bash
# What the pipeline's overlap (--pp-overlap on) hides: the same short training run with the
# overlap off and on, rounds interleaved (a change in the machine's load hits both alike),
# reporting tokens/s, step time and the MoE layers' collective time (moe_comm_ms: the mean
# over ranks of posting plus waiting, i.e. the exchange time not hidden), steps 1-2 of each
# run skipped; the two runs' losses must be identical (the overlap is bit-exact).
#   bench/pp_overlap.sh [rounds=3] [steps=8] [train args...]
# The launcher is $LAUNCH (default: scripts/parmrun -n 4 --); on the emulated cluster:
#   LAUNCH="scripts/cluster run --" bench/pp_overlap.sh 3 8
# Default layout: 4 ranks, pp 2 x ep 2 with pp innermost (--order pp-mp-esp-ep-dp), so that
# on 2 nodes x 2 ranks the EP AllToAll crosses the nodes; micro-batch 4, m = 4.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-8}"
shift $(($# < 2 ? $# : 2))
read -r -a launch <<<"${LAUNCH:-$root/scripts/parmrun -n 4 --}"
args=(--pp 2 --ep 2 --mp 1 --esp 1 --order pp-mp-esp-ep-dp --grad-accum 4)
[ $# -gt 0 ] && args=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$rounds"); do
  for ov in off on; do
    "${launch[@]}" train --config gpt2-moe-tiny --micro-batch 4 --steps "$steps" \
      --eval-every 0 "${args[@]}" --pp-overlap $ov --metrics "$tmp/$ov.r$round.jsonl" \
      >"$tmp/$ov.r$round.log" 2>&1 || { tail -5 "$tmp/$ov.r$round.log"; exit 1; }
  done
done
python3 - "$tmp" "$rounds" "${args[*]}" <<'PY'
import json, sys
tmp, rounds, args = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows, losses = {}, {}
for ov in ("off", "on"):
    rows[ov] = []
    for r in range(1, rounds + 1):
        lines = [json.loads(l) for l in open(f"{tmp}/{ov}.r{r}.jsonl")]
        losses.setdefault(r, {})[ov] = [l["loss"] for l in lines]
        rows[ov] += lines[2:]
same = all(v["off"] == v["on"] for v in losses.values())
print(f"gpt2-moe-tiny {args}, micro-batch 4; {rounds} rounds, steps 1-2 skipped")
print(f"{'overlap':>8} {'tokens/s':>9} {'step ms':>8} {'moe comm ms':>12} {'bubble':>7}")
mean = lambda ov, k: sum(r[k] for r in rows[ov]) / len(rows[ov])
for ov in ("off", "on"):
    print(f"{ov:>8} {mean(ov, 'tokens_per_s'):>9.0f} {mean(ov, 'step_ms'):>8.1f} "
          f"{mean(ov, 'moe_comm_ms'):>12.1f} {100 * mean(ov, 'bubble'):>6.1f}%")
print(f"on/off: tokens/s x{mean('on', 'tokens_per_s') / mean('off', 'tokens_per_s'):.2f}, "
      f"MoE collective time x{mean('on', 'moe_comm_ms') / mean('off', 'moe_comm_ms'):.2f}; "
      f"losses identical: {same}")
sys.exit(0 if same else 1)
PY
