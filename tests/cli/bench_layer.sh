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

finish
