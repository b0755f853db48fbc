#!/usr/bin/env bash
# The cost model on an emulated 2-node cluster (scripts/cluster: 2 nodes x 2 ranks, 1 Gbit/s,
# 50 us): a quick `calibrate` across the nodes, then `bench-layer --sweep` of a tiny grid.
# Checks the profile's terms and sources and the report's structure, never timings.
#
#   bash tests/cli/cluster_sweep.sh <path-to-parm> <source-dir>
#
# Exit 77 (skip) only where namespaces cannot be made: not root, or `unshare --net` fails.
source "$(dirname "$0")/lib/checks.bash" "$@"
CLUSTER=$src/scripts/cluster
PY=/usr/bin/python3

# shellcheck source=lib/cluster_prereq.bash
source "$(dirname "$0")/lib/cluster_prereq.bash"

# A state dir of our own (not cluster.sh's: CTest may run both at once).
PARM_CLUSTER_DIR=/tmp/parm-cluster-sweep-test.$(realpath "$parm" | md5sum | cut -c1-10)
export PARM_CLUSTER_DIR
"$CLUSTER" down >/dev/null || abort "cluster down (of a previous run) failed in $PARM_CLUSTER_DIR"
trap '"$CLUSTER" down >/dev/null 2>&1 || echo "WARNING: cluster down failed in $PARM_CLUSTER_DIR" >&2; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

"$CLUSTER" up --nodes 2 --ranks-per-node 2 --inter-gbit 1 --inter-latency-us 50 ||
  abort "cluster up failed"

out=$("$CLUSTER" run --timeout 300 -- calibrate --out "$tmp/p.json" --max-bytes 1048576 \
        --iters 2 --warmup 1 --gemm-rows 64,256 --gemm-model-dims 64 --gemm-hidden 128 \
        --gemm-iters 1 2>&1); rc=$?
echo "$out" | tail -30
check "calibrate across the nodes" 0 $rc "" "$out"
# Both link classes measured on the real nodes: groups of 2 inside a node; one rank per
# node (ep) and the world (4 ranks, 2 per node) across.
out=$("$PY" - "$tmp/p.json" 2>&1 <<'PY'
import json, re, sys
p = json.load(open(sys.argv[1]))
assert p["version"] == 2, p["version"]
for op in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
    intra, inter = p["collectives"]["intra"][op], p["collectives"]["inter"][op]
    assert intra["source"] == "measured", intra
    assert intra["group_sizes"] == [2], intra
    assert intra["alpha_per_rank_source"].startswith("assumed"), intra
    assert inter["source"] == "measured", inter
    assert inter["group_sizes"] == [2, 4], inter
    assert inter["alpha_per_rank_source"] == "measured", inter
    for k in ("alpha_us", "alpha_per_rank_us", "beta_us_per_byte"):
        assert inter[k] >= 0 and intra[k] >= 0, (op, k)
    # The handshake: a step at the eager limit in the inter-node timings (per-peer messages
    # of 2-32 KiB and 128-512 KiB on ep, 1-16 KiB and 64-256 KiB on the world: both sides of
    # 65472 bytes, two sizes above it in each group); not priced inside a node.
    assert inter["handshake_us"] >= 0, inter
    assert inter["handshake_source"] == "measured (the step at the eager limit)", inter
    assert intra["handshake_us"] == 0, intra
    assert intra["handshake_source"] == "not priced on an intra-node link", intra
# The rendezvous: its fixed cost per step, per_compute and the cap on the compute fitted
# inside the layer, timed at three sizes three times across the calibration
# (calibrate_rendezvous, model.h fit_rendezvous): within a node on mp 2 ep 2 esp 1
# (step_sync_intra), then across the nodes on the calibration's own layout (step_sync and
# step_sync_world, the same values).
def terms(sy, what):
    m = re.fullmatch(r"measured \(inside %s at H 1024, 4096 and 16384, medians of 3 timings "
                     r"each: us ([0-9.]+) per step \+ per_compute ([0-9.]+) x "
                     r"(C|min\(C, ([0-9.]+) ms\))\)" % what, sy["source"])
    assert m, sy
    assert abs(sy["us"] - float(m.group(1))) <= 0.05 + 1e-9, sy
    assert abs(sy["per_compute"] - float(m.group(2))) <= 5e-4, sy
    assert sy["us"] >= 0 and sy["per_compute"] >= 0, sy
    cap = sy["compute_cap_us"]
    assert (cap == 0) if m.group(3) == "C" else abs(cap / 1e3 - float(m.group(4))) <= 0.05, sy
    assert cap == 0 or sy["per_compute"] > 0, sy
for key in ("step_sync", "step_sync_world"):
    terms(p[key], "a layer")
    assert all(p[key][k] == p["step_sync"][k] for k in ("us", "per_compute", "compute_cap_us")), \
        (key, p[key])
terms(p["step_sync_intra"], "a layer whose groups lie within a node")
# The fused overlap is a median of ratios bounded to [0, 1].
assert 0.0 <= p["fused"]["overlap"] <= 1.0, p["fused"]
# The eager shares are taken inside the layer, in [0, 1]: the all-remote one on the
# calibration layout (ep crosses the nodes, esp = 2), the mixed one on mp 2 ep 4 esp 1. Each is
# measured, or refused for the layer's timing noise on this tiny calibration (what it would
# save under a tenth of the layer), never skipped for want of a group of its span.
fu = p["fused"]
for key in ("eager_gain", "eager_gain_mixed"):
    src = fu[key + "_source"]
    assert 0.0 <= fu[key] <= 1.0, fu
    assert src == "measured" or src.startswith("assumed 0 (what gain 1 saves") or \
        src.startswith("assumed (copied from"), (key, fu)
    assert "no inter-node EP group" not in src, (key, fu)
assert fu["eager_limit_bytes"] == 65472 and fu["eager_limit_source"].startswith("assumed"), fu
# The layer's compute steps over their price is measured there and recorded, not applied
# (calibrate_layer.cpp): the scale stays 1, and the source says what was measured.
lc = p["layer_compute"]
assert lc["scale"] == 1.0 and lc["source"].startswith("assumed 1 (the calibration layer measured"), lc
print("ok: profile version 2, intra measured at 2, inter at 2 and 4 ranks across the nodes "
      "with the handshake at the eager limit, the rendezvous and the eager shares taken in the "
      "layer, fused overlap in [0, 1]")
PY
); rc=$?
check "the profile has every term, each with its source" 0 $rc "" "$out"

cat >"$tmp/grid.json" <<'GRID'
{"name": "cluster-cli", "B": [2], "L": [16], "M": [16], "H": [32], "E": [4], "k": [2],
 "f": ["1.2"], "N_MP": [2], "N_ESP": [1, 2], "N_EP": [2, 4], "chunks": 2}
GRID
out=$("$CLUSTER" run --timeout 300 -- bench-layer --sweep "$tmp/grid.json" --profile "$tmp/p.json" \
        --iters 2 --warmup 0 --json "$tmp/sweep.json" 2>&1); rc=$?
echo "$out"
check "bench-layer --sweep across the nodes" 0 $rc "" "$out"
for want in "3 configurations measured (1 skipped)" "selection accuracy" "regret (auto / fastest)" \
            "<- auto" "<- fastest" "median error by schedule" "noise floor" \
            "counting schedules that run the same program as one" "(same program as baseline)" \
            "spread over the rounds" "the measurement against itself" \
            "measured / predicted, median per schedule, of the compute steps" \
            "the same from each half of the rounds (even | odd)"; do
  check "the sweep report has '$want'" 0 0 "$want" "$out"
done
out=$("$PY" - "$tmp/sweep.json" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
for k in ("selection_accuracy", "selection_accuracy_distinct", "median_abs_relative_error",
          "wrong_choices", "median_abs_relative_error_by_schedule", "same_schedule_spread",
          "round_spread", "wrong_choices_rounds_overlap"):
    assert k in s, k
assert 0 <= s["selection_accuracy"] <= s["selection_accuracy_distinct"] <= 1, s
assert 0 <= s["wrong_choices_rounds_overlap"] <= len(s["wrong_choices"]), s
agree = s["measurement_self_agreement"]
assert agree["configs"] == 3 and 0 <= agree["share"] <= 1, agree
assert "worst" in s["auto_over_fastest"] and "median" in s["auto_over_fastest"]
assert s["configs_measured"] == 3 and len(r["configs"]) == 3, s
assert r["ranks_per_node"] == 0  # nodes found by shared memory, not emulated
# The policy view by halves of the rounds, recomputed here from the rows' half times.
hv = s["policies"]["halves"]
cross = auto = 0.0
for c in r["configs"]:
    half = [{x["schedule"]: x["measured_%s_rounds_ms" % h] for x in c["candidates"]}
            for h in ("even", "odd")]
    for i in (0, 1):
        cross += half[1 - i][min(half[i], key=half[i].get)]
        auto += half[i][c["auto"]]
assert abs(hv["cross_fastest_total_ms"] - cross) <= 1e-9 * cross, (hv, cross)
assert abs(hv["auto_total_ms"] - auto) <= 1e-9 * auto, (hv, auto)
for n, v in hv["verdicts"].items():
    e, o = hv["even"]["fixed"][n] < 1, hv["odd"]["fixed"][n] < 1
    assert v == ("halves disagree" if e != o else "beats auto" if e else "does not beat auto"), (n, v, hv)
for c in r["configs"]:
    names = [x["schedule"] for x in c["candidates"]]
    assert c["auto"] in names and c["fastest"] in names, c
    assert c["regret"] >= 1.0 and c["regret"] == c["auto_over_fastest"], c
    assert c["auto_is_fastest"] == (c["auto"] == c["fastest"]), c
    assert c["fastest_even_rounds"] in names and c["fastest_odd_rounds"] in names, c
    assert c["auto_is_fastest_program"] in (True, False) and "auto_over_baseline" in c, c
    for x in c["candidates"]:
        for k in ("predicted_ms", "measured_ms", "measured_min_ms", "predicted_balanced_ms",
                  "busiest_rank_expert_rows", "load_max_over_mean"):
            assert x[k] > 0, (k, x)
        assert x["measured_spread"] >= 0, x
        assert x["measured_min_ms"] <= x["measured_ms"] <= x["measured_max_ms"], x
        # The compute steps (the executor's step timers) and the rest add up to the total.
        for side in ("measured", "predicted"):
            comp, rest = x[side + "_compute_ms"], x[side + "_rest_ms"]
            assert 0 < comp < x[side + "_ms"] and rest > 0, (side, x)
            assert abs(comp + rest - x[side + "_ms"]) <= 1e-9 * x[side + "_ms"], (side, x)
        assert x["measured_compute_ms"] <= x["measured_compute_step_max_ms"] * (1 + 1e-9), x
        assert 0 <= x["measured_outside_steps_ms"] < x["measured_ms"], x
        for part in ("compute", "rest", "total"):
            assert s["measured_over_predicted_by_schedule"][x["schedule"]][part] > 0, (part, s)
    # The twins: S2 unfused compiles to the baseline's step list exactly where N_ESP = 1.
    twins = {x["schedule"]: x.get("same_program_as") for x in c["candidates"]}
    assert (twins.get("s2") == "baseline") == (c["N_ESP"] == 1), (c["N_ESP"], twins)
# N_ESP = 1: the baseline is S2 unfused, priced alike; that pair is the noise floor.
assert s["same_schedule_spread"]["pairs"] >= 2, s["same_schedule_spread"]
print("ok: sweep JSON has the summary keys and one row per configuration")
PY
); rc=$?
check "the sweep JSON has the summary keys and one row per configuration" 0 $rc "" "$out"
finish
