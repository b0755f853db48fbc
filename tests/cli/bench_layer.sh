#!/usr/bin/env bash
# bench-layer's report end to end: --breakdown per step and per phase, the floor and
# time / floor, peak memory, and the same numbers in --json. Checks outputs, never timings.
#   bash bench_layer.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

layer="--tokens 64 --model-dim 16 --hidden 32 --experts 4 --topk 2 --capacity-factor 1.2"
out="$(prun -n 4 -- bench-layer $layer --mp 2 --ep 2 --esp 2 --schedule all --fuse both \
        --iters 2 --warmup 1 --breakdown --json "$tmp/b.json")"; rc=$?
check "bench-layer --breakdown runs every schedule" 0 $rc "s2+fused" "$out"
check "the floor and time / floor are printed" 0 $rc "time / floor =" "$out"
check "peak resident memory is printed" 0 $rc "peak resident" "$out"
check "the expert products are a phase of the experts step" 0 $rc "experts: expert products" "$out"
check "the gate's top-k is a phase of the gate step" 0 $rc "gate: top-k" "$out"
check "the fill counts are counted apart" 0 $rc "ep.metadata=" "$out"
json="$(cat "$tmp/b.json" 2>/dev/null)"
for key in '"breakdown"' '"floor_ms"' '"time_over_floor"' '"floor_gflops"' '"peak_rss_mib"' \
           '"layer_mib"' '"phase": "expert products"' '"step": "fused dispatch'; do
  check "the JSON holds $key" 0 0 "$key" "$json"
done

# At mp = 1 every schedule routes the same tokens the same way, so the floor's filled rows
# (the busiest rank's, and all ranks') are the same for all of them, and all ranks' rows are
# the kept choices of both MP groups: 2 T k less the choices check-layer reports dropped.
# Before, floor_rows were the slowest rank's, which timing noise picks (2044 / 2052 / 2044).
small="--tokens 256 --model-dim 16 --hidden 32 --experts 8 --topk 2 --capacity-factor 1.2"
out="$(prun -n 2 -- bench-layer $small --mp 1 --ep 2 --esp 1 --schedule all --fuse both \
        --iters 2 --warmup 1 --json "$tmp/f.json")"; rc=$?
check "bench-layer at mp 1 over every schedule" 0 $rc "time / floor" "$out"
out="$(prun -n 2 -- check-layer $small --mp 1 --ep 2 --esp 1 --schedule baseline)"; rc=$?
dropped="$(sed -n 's/.*; \([0-9]*\) choices dropped.*/\1/p' <<<"$out" | head -1)"
check "check-layer reports the dropped choices" 0 $rc "choices dropped" "$out"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
out="$("$py" - "$tmp/f.json" "$((2 * 256 * 2 - ${dropped:-0}))" <<'EOF'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
rows = {f'{r["schedule"]}{"+fused" if r["fuse"] else ""}': r.get("floor_rows") for r in results}
totals = [r.get("floor_rows_total") for r in results]
print(f"{len(results)} schedules; floor_rows {rows}; floor_rows_total {totals}")
same = len(results) >= 3 and len(set(rows.values())) == 1
kept = all(t == int(sys.argv[2]) for t in totals)
print("floor rows agree" if same and kept else f"floor rows DIFFER (kept choices {sys.argv[2]})")
EOF
)"
check "the floor's filled rows are the same for every schedule and are the kept choices" 0 0 "floor rows agree" "$out"

# Buffers past cpu::kStreamMinBytes (8 MiB) are written with streaming stores (the dispatched
# rows, the experts' outputs and the combine's gradient rows): 640 tokens x k 8 x M 512 fp32
# is 10 MiB. Every schedule, dropping and dropless, against the fp64 oracle.
for cf in none 1.25; do
  out="$(prun -n 2 -- check-layer --mp 1 --ep 2 --experts 64 --topk 8 --tokens 640 \
        --model-dim 512 --hidden 32 --capacity-factor $cf --schedule all --fuse both)"; rc=$?
  check "check-layer past the streaming threshold (f $cf): s2 passes" 0 $rc "s2: PASS" "$out"
  passed=$(grep -c ": PASS" <<<"$out")
  [ "$passed" = 3 ] && ! grep -q "FAIL" <<<"$out" &&
    ok "check-layer past the streaming threshold (f $cf): baseline, s1 and s2 pass" ||
    bad "check-layer past the streaming threshold (f $cf): $passed of 3 schedules pass"
done
out="$(PARM_STREAM_MIN_BYTES=8M prun -n 2 -- bench-layer $small --mp 1 --ep 2 --iters 1)"
check "PARM_STREAM_MIN_BYTES=8M is refused, naming the valid values" 2 $? "byte counts >= 0" "$out"
grep -q "time / floor" <<<"$out" && bad "the refused PARM_STREAM_MIN_BYTES ran the layer"

finish
