#!/usr/bin/env bash
# Tokens/s of gpt2-moe-tiny under pp 1, 2 and 4 at the same world size and global batch, in
# one run (rounds interleaved, so that a machine's load changes hit every layout alike), with
# the measured pipeline bubble (mean over ranks of the time spent waiting on pp.recv over the
# step time) against 1F1B's (p - 1) / (m + p - 1).
#   bench/pp_tokens.sh [ranks=8] [steps=12] [rounds=2] [extra train args...]
# Layout per stage: mp 2, esp 2 (ep 1); dp = ranks / (2 pp); m = --grad-accum = 8 / dp so that
# every layout steps over the same 8 x micro-batch sequences per DP replica group.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ranks="${1:-8}"
steps="${2:-12}"
rounds="${3:-2}"
shift $(($# < 3 ? $# : 3))
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$rounds"); do
  for pp in 1 2 4; do
    dp=$((ranks / (2 * pp)))
    [ "$dp" -ge 1 ] || continue
    accum=$((8 / dp))
    "$root/scripts/parmrun" -n "$ranks" -- train --config gpt2-moe-tiny --pp $pp --mp 2 --esp 2 \
      --ep 1 --micro-batch 4 --grad-accum $accum --steps "$steps" --eval-every 0 "$@" \
      --metrics "$tmp/pp$pp.r$round.jsonl" >"$tmp/pp$pp.r$round.log" 2>&1 ||
      { tail -5 "$tmp/pp$pp.r$round.log"; exit 1; }
  done
done
python3 - "$tmp" "$ranks" <<'PY'
import glob, json, sys
tmp, ranks = sys.argv[1], int(sys.argv[2])
print(f"gpt2-moe-tiny, {ranks} ranks, mp 2 esp 2 per stage, micro-batch 4; steps 1-2 skipped")
print(f"{'pp':>3} {'m':>3} {'tokens/s':>10} {'vs pp 1':>8} {'bubble':>8} {'1F1B':>8}")
base = None
for pp in (1, 2, 4):
    rows = []
    for f in sorted(glob.glob(f"{tmp}/pp{pp}.r*.jsonl")):
        rows += [json.loads(l) for l in open(f)][2:]
    if not rows: continue
    tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
    base = base or tps
    dp = ranks // (2 * pp); m = 8 // dp
    bub = sum(r.get("bubble", 0.0) for r in rows) / len(rows)
    theory = (pp - 1) / (m + pp - 1)
    print(f"{pp:>3} {m:>3} {tps:>10.0f} {tps / base:>8.2f} {100 * bub:>7.1f}% {100 * theory:>7.1f}%")
PY
