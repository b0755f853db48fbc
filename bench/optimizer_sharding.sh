#!/usr/bin/env bash
# What the distributed optimizer (--optimizer-sharding dp) costs: the same short training run of
# gpt2-moe-tiny without and with sharding, rounds interleaved (a change in the machine's load
# hits both alike), on two layouts: 4 ranks mp 2 ep 2 esp 2 (the main job's: dp 2, edp 1) and 8
# ranks mp 4 ep 2 esp 2 (dp 2, edp 2). Reports tokens/s, step time, comm time and the
# optimizer's time (steps 1-2 of each run skipped) and the moment bytes per rank; the losses of
# the two shardings must be identical (bit-exact by design).
#   bench/optimizer_sharding.sh [rounds=3] [steps=20]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-20}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
layouts=("4 --mp 2 --ep 2 --esp 2" "8 --mp 4 --ep 2 --esp 2")
for round in $(seq "$rounds"); do
  for i in "${!layouts[@]}"; do
    set -- ${layouts[$i]}
    n=$1
    shift
    for sh in none dp; do
      "$root/scripts/parmrun" -n "$n" --job-timeout 900 -- train --config gpt2-moe-tiny \
        --steps "$steps" --eval-every 0 --log-every "$steps" "$@" --optimizer-sharding $sh \
        --metrics "$tmp/$i.$sh.r$round.jsonl" >"$tmp/$i.$sh.r$round.log" 2>&1 ||
        { tail -5 "$tmp/$i.$sh.r$round.log"; exit 1; }
    done
  done
done
python3 - "$tmp" "$rounds" "${layouts[@]}" <<'PY'
import json, sys
tmp, rounds, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"gpt2-moe-tiny, {rounds} rounds interleaved, steps 1-2 of each run skipped")
print(f"{'layout':<28} {'sharding':>8} {'tokens/s':>9} {'step ms':>8} {'comm ms':>8} "
      f"{'optim ms':>8}")
ok = True
for i, lay in enumerate(layouts):
    rows, losses = {}, {}
    for sh in ("none", "dp"):
        rows[sh] = []
        for r in range(1, rounds + 1):
            lines = [json.loads(l) for l in open(f"{tmp}/{i}.{sh}.r{r}.jsonl")]
            losses.setdefault(r, {})[sh] = [l["loss"] for l in lines]
            rows[sh] += lines[2:]
    mean = lambda sh, k: sum(x[k] for x in rows[sh]) / len(rows[sh])
    for sh in ("none", "dp"):
        print(f"np{lay:<26} {sh:>8} {mean(sh, 'tokens_per_s'):>9.0f} {mean(sh, 'step_ms'):>8.1f} "
              f"{mean(sh, 'comm_ms'):>8.1f} {mean(sh, 'optimizer_ms'):>8.2f}")
    same = all(v["none"] == v["dp"] for v in losses.values())
    ok = ok and same
    print(f"np{lay}: dp/none tokens/s x{mean('dp', 'tokens_per_s') / mean('none', 'tokens_per_s'):.3f}; "
          f"losses identical: {same}")
sys.exit(0 if ok else 1)
PY
