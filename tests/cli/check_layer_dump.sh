#!/usr/bin/env bash
# `check-layer --dump` holds everything needed to recompute it: lib/recompute_dump.py redoes
# the layer from the dump alone (plain Python, no Parm code) on layouts with several MP
# groups and checks every source's routing of MP group 0 and the expert gradients summed
# over all MP groups; with --force-ties the tie rule decides some routings and every schedule
# and the oracle must agree on them. A dump missing another group's input, or with a changed
# routing, must be refused by the recomputation.
#   bash check_layer_dump.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

py=/usr/bin/python3
[ -x "$py" ] || py=python3
recompute() { "$py" "$src/tests/cli/lib/recompute_dump.py" "$@" 2>&1; }
layer="--tokens 16 --model-dim 8 --hidden 8 --experts 4 --topk 2 --capacity-factor 1.0"

# 2 MP groups, ESP 2: every schedule, fused and not, with drops.
out="$(prun -n 4 -- check-layer $layer --mp 2 --ep 2 --esp 2 --schedule all --fuse both --dump "$tmp/a")"; rc=$?
check "check-layer --dump at mp 2, ep 2, esp 2" 0 $rc "dumped to" "$out"
manifest="$(cat "$tmp/a/manifest.json" 2>/dev/null)"
for key in '"input.x.g1.npy"' '"input.dout.g1.npy"' '"oracle_sliced.slot.npy"' \
           '"s1.expert.npy"' '"s2_fused.kept.npy"' '"baseline.slot.npy"' '"gate_slices"' \
           'capacity C = ceil(k f (T / 2) / E)'; do
  check "the manifest lists $key" 0 0 "$key" "$manifest"
done
out="$(recompute "$tmp/a")"; rc=$?
check "the dump recomputes: 2 MP groups, every source" 0 $rc "recompute_dump: 43 passed, 0 failed" "$out"

# SwiGLU experts (docs/spec.md §8): w3 dumped beside w1 and w2, no biases; recomputed alike.
out="$(prun -n 4 -- check-layer $layer --mp 2 --ep 1 --esp 2 --expert-mlp swiglu --schedule all --dump "$tmp/sw")"; rc=$?
check "check-layer --expert-mlp swiglu --dump at mp 2, esp 2" 0 $rc "dumped to" "$out"
check "the swiglu manifest names the experts' kind" 0 0 '"expert_mlp": "swiglu"' "$(cat "$tmp/sw/manifest.json" 2>/dev/null)"
out="$(recompute "$tmp/sw")"; rc=$?
check "the swiglu dump recomputes, dw3 among the gradients" 0 $rc "oracle: dw3 summed over 2 MP groups" "$out"
check "the swiglu dump recomputes, every check passes" 0 $rc " 0 failed" "$out"

# Shared experts (docs/spec.md §9): their parameters (param.sw1 ...) and every source's
# gradients (dsw1 ..., dswg) are dumped, and the recomputation redoes them: one rank, gelu;
# 2 MP groups (each MP rank holding H_s / 2 columns), swiglu, two gated shared experts, at bf16.
out="$(prun -n 1 -- check-layer $layer --shared-experts 1 --dump "$tmp/sh")"; rc=$?
check "check-layer --shared-experts --dump" 0 $rc "dumped to" "$out"
out="$(recompute "$tmp/sh")"; rc=$?
check "the shared experts' dump recomputes, dsb2 among the gradients" 0 $rc "s1: dsb2 summed over 1 MP groups" "$out"
check "the shared experts' dump recomputes, every check passes" 0 $rc " 0 failed" "$out"
out="$(prun -n 4 -- check-layer $layer --mp 2 --ep 2 --esp 2 --schedule all --expert-mlp swiglu \
       --shared-experts 2 --shared-gate on --precision bf16 --dump "$tmp/shg")"; rc=$?
check "check-layer --shared-experts 2 --shared-gate on --expert-mlp swiglu --precision bf16 --dump" 0 $rc "dumped to" "$out"
manifest="$(cat "$tmp/shg/manifest.json" 2>/dev/null)"
for key in '"param.sw3.npy"' '"param.swg.npy"' '"oracle.dswg.npy"' '"baseline.dsw3.npy"'; do
  check "the shared experts' manifest lists $key" 0 0 "$key" "$manifest"
done
out="$(recompute "$tmp/shg")"; rc=$?
check "the gated shared experts' dump recomputes, dswg among the gradients" 0 $rc "oracle: dswg summed over 2 MP groups" "$out"
check "the gated shared experts' dump recomputes, every check passes" 0 $rc " 0 failed" "$out"
# The recomputation can fail here too: without the shared gate the outputs differ.
cp -r "$tmp/shg" "$tmp/shg_off"
sed -i 's/"shared_gate": true/"shared_gate": false/' "$tmp/shg_off/manifest.json"
out="$(recompute "$tmp/shg_off")"; rc=$?
check "a shared-experts dump recomputed without its gate fails" 1 $rc "FAIL: oracle: out of MP group 0" "$out"

# The recomputation can fail: with group 1's input replaced by group 0's (all a dump held
# before), the expert gradients differ; with one chosen expert changed, the routing differs.
cp -r "$tmp/a" "$tmp/b"
cp "$tmp/a/input.x.npy" "$tmp/b/input.x.g1.npy"
out="$(recompute "$tmp/b")"; rc=$?
check "a dump without group 1's input fails on the expert gradients" 1 $rc "FAIL: oracle: dw1 summed over 2 MP groups" "$out"
cp -r "$tmp/a" "$tmp/c"
"$py" - "$tmp/c/s2.expert.npy" <<'EOF'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[-4] = (data[-4] + 1) % 4  # the last token's last choice, another expert
open(path, "wb").write(bytes(data))
EOF
out="$(recompute "$tmp/c")"; rc=$?
check "a changed routing is seen" 1 $rc "FAIL: s2: routing of MP group 0" "$out"

# Ties: 2 MP groups, ESP 1 (baseline too), and 4 MP groups at mp 1.
for lay in "--mp 2 --ep 2 --esp 1" "--mp 1 --ep 4 --esp 1"; do
  d="$tmp/t${lay// /}"
  out="$(prun -n 4 -- check-layer $layer $lay --schedule all --force-ties --dump "$d")"; rc=$?
  check "check-layer --force-ties $lay passes, routing identical" 0 $rc "tokens routed by the tie rule; routing identical" "$out"
  if grep -q " 0 tokens routed by the tie rule" <<<"$out"; then
    check "--force-ties $lay makes ties" 0 1 "" ""
  fi
  out="$(recompute "$d" --expect-ties)"; rc=$?
  check "the --force-ties dump recomputes ($lay), ties included" 0 $rc " 0 failed" "$out"
  check "ties were decided ($lay)" 0 $rc "token routings decided by the tie rule" "$out"
done
out="$(prun -n 1 -- check-layer $layer --dump "$tmp/n")"; rc=$?
out="$(recompute "$tmp/n" --expect-ties)"; rc=$?
check "without --force-ties there are no ties to decide" 1 $rc "FAIL: 0 token routings decided by the tie rule" "$out"

finish
