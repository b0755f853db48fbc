#!/usr/bin/env bash
# bench/tools/reprice.py: the offline re-pricing of a measured sweep. A hand-written profile
# and a two-configuration sweep whose "measured" times are made from `parm plan`'s own
# predictions: in the first the model's choice is measured fastest (right), in the second it
# is measured 2x slower than its prediction (wrong, regret known). Checks the judged
# numbers, not any timing of this machine.
#   bash reprice.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

/usr/bin/python3 - "$tmp/p.json" <<'PY'
import json, sys
def comm(alpha, beta):
    return {"alpha_us": alpha, "alpha_per_rank_us": 0.0, "beta_us_per_byte": beta, "r2": 1.0,
            "samples": 1, "group_sizes": [2], "source": "test", "alpha_per_rank_source": "test"}
ops = {"allreduce": comm(10, 1e-3), "allgather": comm(20, 1e-3), "reduce_scatter": comm(20, 1e-3),
       "alltoall": comm(30, 2e-3)}
fit = {"alpha_us": 1.0, "gflops": 10.0, "r2": 1.0, "samples": 1, "source": "test"}
mem = {"alpha_us": 0.0, "gbps": 5.0, "r2": 1.0, "samples": 1, "source": "test"}
json.dump({"version": 2, "machine": {"ranks": 4, "nodes": 2}, "device": "cpu",
           "collectives": {"intra": ops, "inter": ops},
           "fused": {"overlap": 1.0, "per_piece_us": 0.0, "r2": 1.0, "samples": 1, "source": "test"},
           "step_sync": {"us": 0.0, "samples": 1, "source": "test"},
           "gemm": {k: fit for k in ("expert_nn", "expert_tn", "expert_nt", "gate")},
           "memory": {"copy": mem, "gelu": mem}}, open(sys.argv[1], "w"))
PY

# The sweep: every candidate's measured time its predicted one, except the model's choice in
# the second configuration, measured at twice its prediction.
plan() {  # plan <esp> <out>
  "$parm" plan --profile "$tmp/p.json" --tokens 64 --model-dim 16 --hidden 32 --experts 4 \
    --topk 2 --capacity-factor 1.2 --mp 2 --esp "$1" --ep 2 --devices-per-node 2 --world 4 \
    --schedule all --fuse both --chunks 4 --json "$2" >/dev/null 2>&1
}
plan 1 "$tmp/a.json" && plan 2 "$tmp/b.json"
check "parm plan prices both configurations" 0 $? "" ""
want="$(/usr/bin/python3 - "$tmp/a.json" "$tmp/b.json" "$tmp/sweep.json" <<'PY'
import json, sys
configs = []
for i, path in enumerate(sys.argv[1:3]):
    cands = json.load(open(path))["candidates"]
    auto = min(cands, key=lambda c: c["total_ms"])["schedule"]  # first on ties, as `choose`
    rows = []
    for c in cands:
        ms = c["total_ms"] * (2.0 if i == 1 and c["schedule"] == auto else 1.0)
        rows.append({"schedule": c["schedule"], "measured_ms": ms})
    fastest = min(rows, key=lambda r: r["measured_ms"])
    configs.append({"id": i, "T": 64, "M": 16, "H": 32, "E": 4, "k": 2, "f": "1.2", "N_MP": 2,
                    "N_ESP": 1 + i, "N_EP": 2, "fastest": fastest["schedule"], "candidates": rows})
    if i == 1:
        regret = 2.0 * min(c["total_ms"] for c in cands) / fastest["measured_ms"]
        print("worst %.3f" % regret)
json.dump({"world": 4, "chunks": 4, "ranks_per_node": 2, "configs": configs},
          open(sys.argv[3], "w"))
PY
)"
out="$(/usr/bin/python3 "$src/bench/tools/reprice.py" --sweep "$tmp/sweep.json" \
        --profile "$tmp/p.json" --parm "$parm" --wrong --json "$tmp/r.json" 2>&1)"
check "reprice judges one right and one wrong choice" 0 $? \
  "selection 50.0% plain, 50.0% distinct" "$out"
[ -n "$want" ] || want="(the sweep was not written)"  # an empty text would match anything
check "the regret of the wrong choice is measured auto / measured fastest" 0 0 "$want" "$out"
check "the wrong configuration is listed" 0 0 "  wrong #1 T=64 M=16 H=32 k=2 esp=2 ep=2" "$out"
# Every (configuration, schedule) error: 0 except the doubled one (|p - 2p| / 2p = 0.5).
err="$(/usr/bin/python3 -c "
import json, sys
r = json.load(open('$tmp/r.json'))['$tmp/p.json']
print('median %.3f wrong %d' % (r['median_abs_relative_error'], len(r['wrong_choices'])))")"
check "the median error over every pair is 0 and one choice is wrong" 0 $? "median 0.000 wrong 1" "$err"

# --ratios with the sweep's split (bench-layer --sweep: measured_compute_ms, measured_rest_ms):
# every compute step measured at its price, the rest at 3x its price.
/usr/bin/python3 - "$tmp/a.json" "$tmp/split.json" <<'PY'
import json, sys
rows = []
for c in json.load(open(sys.argv[1]))["candidates"]:
    comp, rest = c["compute_ms"], 3.0 * (c["total_ms"] - c["compute_ms"])
    r = (comp + rest) / c["total_ms"]
    rows.append({"schedule": c["schedule"], "measured_ms": comp + rest,
                 "measured_fwd_ms": r * c["fwd_ms"], "measured_bwd_ms": r * c["bwd_ms"],
                 "measured_compute_ms": comp, "measured_rest_ms": rest})
json.dump({"world": 4, "chunks": 4, "ranks_per_node": 2,
           "configs": [{"id": 0, "T": 64, "M": 16, "H": 32, "E": 4, "k": 2, "f": "1.2",
                        "N_MP": 2, "N_ESP": 1, "N_EP": 2, "fastest": rows[0]["schedule"],
                        "candidates": rows}]}, open(sys.argv[2], "w"))
PY
out="$(/usr/bin/python3 "$src/bench/tools/reprice.py" --sweep "$tmp/split.json" \
        --profile "$tmp/p.json" --parm "$parm" --ratios 2>&1)"
check "reprice --ratios splits compute and the rest" 0 $? "s1        measured/predicted" "$out"
check "the split is measured / predicted of each part" 0 0 "; compute 1.00 rest 3.00" "$out"
finish
