#!/usr/bin/env bash
# The cost model's commands end to end: refusals without a profile, a quick calibration (with
# its single-machine fallbacks), plan, bench-layer --schedule auto and --sweep, and the
# simulator on the shipped cluster and grid files. Checks outputs, never timings.
#   bash perfmodel.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

layer="--tokens 64 --model-dim 16 --hidden 32 --experts 4 --topk 2 --capacity-factor 1.2"

out="$(prun -n 1 -- plan $layer --mp 2 --ep 2 --esp 2)"; rc=$?
check "plan without --profile is refused" 2 $rc "plan needs a cost profile" "$out"
out="$(prun -n 2 -- bench-layer $layer --ep 2 --schedule auto)"; rc=$?
check "bench-layer --schedule auto without --profile is refused" 2 $rc "calibrate --out" "$out"
out="$(prun -n 2 -- bench-layer $layer --ep 2 --fuse auto --profile "$tmp/none.json")"; rc=$?
check "a missing profile file is refused" 2 $rc "none.json cannot be read" "$out"

out="$(prun -n 2 -- calibrate --out "$tmp/one.json" --gemm-rows 64)"; rc=$?
check "calibrate with one GEMM row count is refused" 2 $rc "at least two different row counts" "$out"
[ ! -e "$tmp/one.json" ]; check "a refused calibration writes no profile" 0 $? "" ""

# --device cuda where this build or machine has no GPU: refused before any work (even before
# the world-size check: one rank here), naming what is missing and what would work.
if ! prun -n 1 -- info | grep -q "cuda:   built; [1-9]"; then
  out="$(prun -n 1 -- calibrate --out "$tmp/cuda.json" --device cuda)"; rc=$?
  check "calibrate --device cuda without a GPU is refused" 2 $rc "use --device cpu" "$out"
  [ ! -e "$tmp/cuda.json" ]; check "the refused device calibration writes no profile" 0 $? "" ""
fi
out="$(prun -n 1 -- calibrate --out "$tmp/c.json" --comm nccl)"; rc=$?
check "calibrate --comm without --device cuda is refused" 2 $rc "pass it with --device cuda" "$out"

out="$(prun -n 2 -- calibrate --out "$tmp/eager.json" --eager-limit-bytes -5)"; rc=$?
check "calibrate with a negative eager limit is refused" 2 $rc "--eager-limit-bytes -5 must be at least 0" "$out"
out="$(prun -n 2 -- calibrate --out "$tmp/two.json" --min-bytes 4096 --max-bytes 16384)"; rc=$?
check "calibrate with two collective sizes is refused" 2 $rc "at least 16 times it" "$out"

# A quick calibration on 2 ranks: one machine, so nodes are emulated (1 rank each): no
# intra-node group with more than one rank, no ESP group for the fused collectives.
out="$(prun -n 2 -- calibrate --out "$tmp/p.json" --max-bytes 65536 --iters 2 --warmup 1 \
        --gemm-rows 64,512 --gemm-model-dims 64 --gemm-hidden 128 --gemm-iters 1 \
        --samples "$tmp/raw.json")"; rc=$?
check "calibrate writes a profile" 0 $rc "wrote $tmp/p.json" "$out"
# The memory kernels are measured on a layer's buffer sizes (64 KiB .. 2 MiB read and as
# much written), not on buffers that leave the cache.
mem=$(/usr/bin/python3 -c 'import json, sys
x = [s["x"] for s in json.load(open(sys.argv[1])) if s["entry"].startswith("memory.")]
print(len(x), int(min(x)), int(max(x)))' "$tmp/raw.json" 2>&1)
check "calibrate measures memory on 64 KiB .. 2 MiB buffers" 0 0 "12 131072 4194304" "$mem"
check "calibrate emulates nodes on one machine" 0 $rc "Emulating 2 nodes" "$out"
check "calibrate copies the missing link class" 0 $rc "assumed (copied from inter" "$out"
check "calibrate prints r2 per entry" 0 $rc "gemm.expert_nn" "$out"
# One rank per emulated node: no EP group with a peer on a rank's own node, so the mixed
# span's eager share is not measured, and the profile says so.
mixed=$(/usr/bin/python3 -c 'import json, sys
f = json.load(open(sys.argv[1]))["fused"]
print(f["eager_gain_mixed"], f["eager_gain_mixed_source"])' "$tmp/p.json" 2>&1)
check "calibrate writes the mixed span's eager share and its source" 0 0 "0.0 assumed 0 (" "$mixed"
check "calibrate prints the mixed span's eager share" 0 $rc "fused eager gain, mixed" "$out"
rec=$(/usr/bin/python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
print(p["device"], p["machine"]["device"]["device"], p["machine"]["gemm_precision"], p["machine"]["comm"])
p["device"] = "cuda"
json.dump(p, open(sys.argv[2], "w"))' "$tmp/p.json" "$tmp/p-cuda.json" 2>&1)
check "calibrate records the device, the products' precision and the collectives" 0 0 "cpu cpu fp32 mpi" "$rec"
out="$(prun -n 2 -- bench-layer $layer --ep 2 --schedule auto --profile "$tmp/p-cuda.json")"; rc=$?
check "bench-layer --schedule auto on the CPU refuses a cuda profile" 2 $rc "was taken on device cuda" "$out"

out="$(prun -n 1 -- plan $layer --mp 2 --ep 2 --esp 2 --devices-per-node 2 --profile "$tmp/p.json")"; rc=$?
check "plan prints every candidate" 0 $rc "== s2+fused" "$out"
check "plan names the links" 0 $rc "links: mp intra, ep inter, esp intra" "$out"
check "plan makes a choice" 0 $rc "choice: " "$out"
# --order decides which groups cross nodes (docs/layout.md): MP inside a node, EP across.
out="$(prun -n 1 -- plan $layer --mp 2 --ep 2 --world 4 --devices-per-node 2 --profile "$tmp/p.json")"; rc=$?
check "plan: the default order keeps EP inside a node" 0 $rc "order mp-esp-ep-dp-pp; links: mp intra, ep intra" "$out"
out="$(prun -n 1 -- plan $layer --mp 2 --ep 2 --world 4 --devices-per-node 2 --order mp-dp-ep --profile "$tmp/p.json")"; rc=$?
check "plan follows --order" 0 $rc "order mp-dp-ep-esp-pp; links: mp intra, ep inter" "$out"

sed 's/"version": 2/"version": 7/' "$tmp/p.json" >"$tmp/v7.json"
out="$(prun -n 1 -- plan $layer --profile "$tmp/v7.json")"; rc=$?
check "a profile of another version is refused" 2 $rc "'version' is 7" "$out"

out="$(prun -n 4 -- bench-layer $layer --mp 2 --ep 2 --esp 2 --ranks-per-node 2 \
        --schedule auto --fuse auto --profile "$tmp/p.json" --iters 1 --warmup 0 --breakdown)"; rc=$?
check "bench-layer auto prints the candidates and runs the choice" 0 $rc "# auto chose" "$out"
check "bench-layer prices the run with its measured routing" 0 $rc \
  "with the measured routing (load_max_over_mean" "$out"
check "bench-layer --breakdown with a profile prints every step's prediction" 0 $rc \
  "step (predicted vs measured max)" "$out"

cat >"$tmp/grid.json" <<'GRID'
{"name": "cli", "B": [2], "L": [16], "M": [16], "H": [32], "E": [4], "k": [1, 2], "f": ["1.2"],
 "N_MP": [2], "N_ESP": [2], "N_EP": [2, 4], "chunks": 2}
GRID
out="$(prun -n 4 -- bench-layer --sweep "$tmp/grid.json" --profile "$tmp/p.json" \
        --ranks-per-node 2 --iters 1 --warmup 0 --json "$tmp/sweep.json")"; rc=$?
check "bench-layer --sweep measures what fits" 0 $rc "2 configurations measured (2 skipped)" "$out"
check "bench-layer --sweep reports selection accuracy" 0 $rc "selection accuracy" "$out"
grep -q '"median_abs_relative_error"' "$tmp/sweep.json" 2>/dev/null
check "bench-layer --sweep writes JSON" 0 $? "" ""
# The split of each candidate's time into its compute steps and the rest, measured (the
# executor's step timers) and predicted: the parts add up to the totals, per schedule in the
# summary.
out="$(/usr/bin/python3 - "$tmp/sweep.json" 2>&1 <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
split = r["summary"]["measured_over_predicted_by_schedule"]
for c in r["configs"]:
    for x in c["candidates"]:
        for side in ("measured", "predicted"):
            comp, rest, total = x[side + "_compute_ms"], x[side + "_rest_ms"], x[side + "_ms"]
            assert 0 < comp < total and rest > 0, (side, x)
            assert math.isclose(comp + rest, total, rel_tol=1e-9), (side, x)
        assert x["measured_compute_ms"] <= x["measured_compute_step_max_ms"] * (1 + 1e-9), x
        assert 0 <= x["measured_outside_steps_ms"] < x["measured_ms"], x
        for part in ("compute", "rest", "total"):
            assert split[x["schedule"]][part] > 0, (part, split)
print("split ok")
PY
)"
check "bench-layer --sweep splits compute and the rest" 0 $? "split ok" "$out"

for c in pcie-8gpu cluster-32gpu; do
  out="$(prun -n 1 -- simulate --cluster "$src/configs/clusters/$c.json" \
          --grid "$src/configs/grids/paper-1296.json" --out "$tmp/$c")"; rc=$?
  check "simulate $c" 0 $rc "1296 in the grid" "$out"
  lines=$(wc -l <"$tmp/$c/results.csv" 2>/dev/null || echo 0)
  check "simulate $c writes 1296 CSV rows" 1297 "$lines" "" ""
  [ -s "$tmp/$c/summary.json" ] && grep -q "<svg" "$tmp/$c/speedup.svg"
  check "simulate $c writes summary.json and speedup.svg" 0 $? "" ""
done

# A cluster file from the calibrated profile (bench/tools/cluster_from_profile.py), which
# simulate then reads; a file that is no profile is refused, naming what is missing.
out="$(/usr/bin/python3 "$src/bench/tools/cluster_from_profile.py" --profile "$tmp/p.json" \
        --name from-p --description "the CTest calibration" --out "$tmp/from-p.json" 2>&1)"
check "cluster_from_profile writes a cluster file" 0 $? "" "$out"
out="$(/usr/bin/python3 -c 'import json, sys
p, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for k in ("us", "per_compute", "compute_cap_us"):
    assert c.get("step_sync_intra_" + k, 0) == p["step_sync_intra"][k], (k, c, p["step_sync_intra"])
    assert c.get("step_sync_" + k, 0) == p["step_sync"][k], (k, c, p["step_sync"])
print("ok")' "$tmp/p.json" "$tmp/from-p.json" 2>&1)"
check "the cluster file carries both rendezvous lines of the profile" 0 $? "ok" "$out"
out="$(prun -n 1 -- simulate --cluster "$tmp/from-p.json" \
        --grid "$src/configs/grids/cluster-sample.json" --out "$tmp/sim-from-p")"; rc=$?
check "simulate reads the cluster file made from the profile" 0 $rc "in the grid" "$out"
echo '{"machine": {"nodes": 2, "ranks": 4}}' >"$tmp/not-a-profile.json"
out="$(/usr/bin/python3 "$src/bench/tools/cluster_from_profile.py" \
        --profile "$tmp/not-a-profile.json" --name x --description y 2>&1)"
check "cluster_from_profile refuses a file without collectives" 2 $? "no collectives.intra" "$out"
/usr/bin/python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
next(iter(p["collectives"]["inter"].values()))["beta_us_per_byte"] = "fast"
json.dump(p, open(sys.argv[2], "w"))' "$tmp/p.json" "$tmp/bad-beta.json"
out="$(/usr/bin/python3 "$src/bench/tools/cluster_from_profile.py" \
        --profile "$tmp/bad-beta.json" --name x --description y --out "$tmp/bad.json" 2>&1)"
check "cluster_from_profile names a value that is no number" 2 $? \
  "beta_us_per_byte is 'fast': need a finite number >= 0" "$out"
[ ! -e "$tmp/bad.json" ]
check "cluster_from_profile writes nothing for a refused profile" 0 $? "" ""

finish
