#!/usr/bin/env bash
# The LM head at a 32k vocabulary under mp 2 (docs/vocab-parallel.md): gpt2-moe-tiny with
# "vocab": 32000 trained a few steps on 2 ranks with --phase-times, under
#   split: --mp 2 --esp 2  (vocabulary-parallel: each rank V/2 rows, logits (T, V/2))
#   whole: --mp 1 --ep 2   (dp 2: each rank the whole head on its T tokens: the work each MP
#                           rank did before the head was split, on the same T per rank)
# rounds interleaved; reports the medians (steps 3.. of each run) of the step time and of
# the embed+head phase, the head's share of the step, and the head's memory per rank.
#   bench/vocab_head.sh [rounds=2] [steps=12]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-2}"
steps="${2:-12}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$root/configs/gpt2-moe-tiny.json" "$tmp/cfg.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["name"] = "gpt2-moe-tiny-v32k"
c["model"]["vocab"] = 32000
json.dump(c, open(sys.argv[2], "w"))
PY
for round in $(seq "$rounds"); do
  for lay in split whole; do
    if [ $lay = split ]; then args=(--mp 2 --esp 2 --ep 1); else args=(--mp 1 --esp 1 --ep 2); fi
    "$root/scripts/parmrun" -n 2 --job-timeout 900 -- train --config "$tmp/cfg.json" \
      --steps "$steps" --log-every 1 --eval-every 0 --phase-times "${args[@]}" \
      --metrics "$tmp/$lay.r$round.jsonl" >"$tmp/$lay.r$round.log" 2>&1 ||
      { tail -5 "$tmp/$lay.r$round.log"; exit 1; }
  done
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
T, V, M = 8 * 64, 32000, 128
res = {}
for lay in ("split", "whole"):
    step, head = [], []
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{lay}.r{r}.jsonl"):
            m = json.loads(line)
            if m["step"] < 3 or "phase_ms" not in m:
                continue
            step.append(m["step_ms"])
            head.append(m["phase_ms"]["embed+head"])
    res[lay] = (statistics.median(step), statistics.median(head))
(s_step, s_head), (w_step, w_head) = res["split"], res["whole"]
before = s_step - s_head + w_head  # the mp 2 step with the whole head on every MP rank
for name, rows in (("whole (before)", V), ("split (after)", V // 2)):
    logits = T * rows * 4 / 2**20
    table = 4 * rows * M * 4 / 2**20  # wte value, gradient, AdamW m and v
    print(f"{name:15s} head memory per rank: logits (T={T}, {rows}) {logits:.1f} MiB, "
          f"wte + grad + moments {table:.1f} MiB")
print(f"embed+head per step: whole V on a rank {w_head:.1f} ms, V/2 + the mp all-reduces "
      f"{s_head:.1f} ms ({w_head / s_head:.2f}x)")
print(f"mp 2 step: after {s_step:.1f} ms, head share {100 * s_head / s_step:.1f}%; before "
      f"(after - split head + whole head) {before:.1f} ms, head share "
      f"{100 * w_head / before:.1f}%")
PY
