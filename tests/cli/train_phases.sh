#!/usr/bin/env bash
# train --phase-times (issue 16): the progress line's phase split and the metrics key
# phase_ms name every phase with a time >= 0, and timing them changes no result (the same
# losses, bit for bit, as the run without it).
#   bash train_phases.sh <path to parm> <source dir>
set -uo pipefail
parm="$1"
src="$2"
export PARM_BIN="$parm"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fails=0
ok() { echo "ok:   $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
run=("$src/scripts/parmrun" -n 2 --timeout 300 -- train --steps 3 --micro-batch 2
     --mp 2 --ep 2 --esp 1 --eval-every 0 --corpus "file:$src/README.md")
"${run[@]}" --metrics "$work/plain.jsonl" >"$work/plain.log" 2>&1 || bad "train without --phase-times"
"${run[@]}" --phase-times --metrics "$work/phases.jsonl" >"$work/phases.log" 2>&1 ||
  bad "train --phase-times"
if grep -q "phases (ms, world rank 0):  embed+head .* attention .* dense .* moe .* grad-reduce .* optimizer" "$work/phases.log"; then
  ok "progress line names every phase"
else
  bad "no phases line with every phase: $(grep phases "$work/phases.log" | head -1)"
fi
if /usr/bin/python3 - "$work/plain.jsonl" "$work/phases.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
want = {"embed+head", "attention", "dense", "moe", "grad-reduce", "optimizer"}
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    assert "phase_ms" not in x, x
    assert set(y["phase_ms"]) == want, y["phase_ms"]
    assert all(v >= 0 for v in y["phase_ms"].values()), y["phase_ms"]
    for k in ("loss", "aux_loss", "grad_norm"):
        assert x[k] == y[k], (k, x[k], y[k])
PY
then ok "metrics phase_ms has every phase; losses equal the untimed run's"; else bad "phase_ms or losses"; fi
[ $fails -eq 0 ] && echo "train_phases: all passed" || echo "train_phases: $fails failed"
exit $((fails > 0))
