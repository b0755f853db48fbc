#!/usr/bin/env bash
# bench/gpu-check's shapes stage without a GPU: the script parses, and bench/gpu_check_table.py
# turns parm-shape-<i>.json files (fabricated ones at the issue's shapes, a real CPU
# `bench-layer --json`, an unreadable one) into rows against the issue's targets.
#   bash gpu_check_table.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

out="$(bash -n "$src/bench/gpu-check" 2>&1)"; rc=$?
check "bench/gpu-check parses (bash -n)" 0 $rc "" "$out"
out="$(grep -c 'stage_shapes' "$src/bench/gpu-check")"
check "bench/gpu-check defines and runs the shapes stage" 0 0 "2" "$out"

# Its deadline: capped LIMIT RESERVE cuts a run's limit to what is left before
# GPU_CHECK_DEADLINE_S (less the reserve, at least 1 s), so a run started late cannot outlast
# the device tool's limit.
out="$(bash -c 'source <(sed -n "/^capped() {/,/^}/p" "$1")
  deadline_s=100
  elapsed() { echo "$t"; }
  for t in 0 40 95 120; do printf "%s " "$(capped 50 15)"; done' _ "$src/bench/gpu-check" 2>&1)"
check "gpu-check caps run limits by its deadline" 0 $? "50 45 1 1 " "$out"
# The equiv stage runs the dropless checks (issue 18) before the bf16 ones, so that a bf16
# run hanging to its limit cannot starve them.
out="$(awk '/check_layer fp32 "\$spec" none/ && !d {d = NR} /check_layer bf16 "\$spec" 1.0/ && !b {b = NR}
            END {print (d > 0 && b > d) ? "dropless first" : "order " d " " b}' "$src/bench/gpu-check")"
check "gpu-check runs dropless before bf16" 0 0 "dropless first" "$out"

r="$tmp/res"
mkdir -p "$r"
# shape_json FILE T M H E K FWD BWD FLOOR_MS FLOOR_GFLOPS
shape_json() {
  cat >"$1" <<JSON
{"config": {"tokens": $2, "model_dim": $3, "hidden": $4, "experts": $5, "topk": $6,
            "device": "cuda", "precision": "bf16"},
 "results": [{"schedule": "s1", "fuse": false,
              "forward_ms": {"median": $7, "max": $7}, "backward_ms": {"median": $8, "max": $8},
              "floor_ms": $9, "floor_gflops": ${10}, "time_over_floor": 1.5, "floor_rows": 100}]}
JSON
}
shape_json "$r/parm-shape-1.json" 1024 512 2048 8 2 0.2 0.3 0.3 100000  # 0.5 ms > 0.45
shape_json "$r/parm-shape-2-graphs1.json" 8192 1024 4096 16 2 0.6 1.2 1.3 620000  # 1.8 ms <= 1.9
echo 'not json' >"$r/parm-shape-3.json"
# A real bench-layer JSON (the CPU path, a tiny shape without a target): the keys the table
# reads are the ones bench-layer writes.
out="$(prun -n 1 -- bench-layer --tokens 64 --model-dim 16 --hidden 32 --experts 4 --topk 2 \
        --capacity-factor 1.2 --schedule s1 --iters 2 --warmup 1 --json "$r/parm-shape-4.json")"
rc=$?
check "bench-layer --json for the table" 0 $rc "time / floor" "$out"

out="$("$py" "$src/bench/gpu_check_table.py" "$r" --json-out "$r/summary.json" 2>&1)"; rc=$?
check "the table reads the shapes" 0 $rc "GPU-layer issue shapes" "$out"
check "a shape over its time target is MISSED, by its ratio" 0 $rc \
  "<= 0.45 ms: MISSED (1.11x)" "$out"
check "a shape under its targets is met" 0 $rc "<= 1.9 ms: met (0.95x); floor >= 600: met" "$out"
check "the layer's TFLOP/s are the floor's FLOPs per ms of the layer" 0 $rc \
  "8192 1024 4096 16 2     on         1.800     1.300     1.50      448        620" "$out"
check "an unreadable file is a note" 0 $rc "parm-shape-3.json unreadable" "$out"
check "a real bench-layer JSON gives a row" 0 $rc "64 16 32 4 2" "$out"
check "a shape without a target is a note" 0 $rc "has no target" "$out"
json="$(cat "$r/summary.json" 2>/dev/null)"
check "the summary JSON holds the shapes" 0 0 '"meets_ms": false' "$json"
finish
