#!/usr/bin/env bash
# train --phase-times (issue 16): the progress line's phase split and the metrics key
# phase_ms name every phase with a time >= 0, and timing them changes no result (the same
# losses, bit for bit, as the run without it).
#   bash train_phases.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

args=(-n 2 -- train --steps 3 --micro-batch 2 --mp 2 --ep 2 --esp 1 --eval-every 0
      --corpus "file:$src/README.md")
out="$(prun "${args[@]}" --metrics "$tmp/plain.jsonl")"
check "train without --phase-times" 0 $? "summary" "$out"
out="$(prun "${args[@]}" --phase-times --metrics "$tmp/phases.jsonl")"
check "train --phase-times" 0 $? "phases (ms, world rank 0):  embed+head" "$out"
line="$(grep -F 'phases (ms' <<<"$out" | head -1)"
names=""
for p in embed+head attention dense moe grad-reduce grad-norm optimizer; do
  grep -qF " $p " <<<"$line" && names="$names $p"
done
check "the phases line names every phase" 0 0 \
  " embed+head attention dense moe grad-reduce grad-norm optimizer" "$names"
out="$(/usr/bin/python3 - "$tmp/plain.jsonl" "$tmp/phases.jsonl" 2>&1 <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
want = {"embed+head", "attention", "dense", "moe", "grad-reduce", "grad-norm", "optimizer"}
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    assert "phase_ms" not in x, x
    assert set(y["phase_ms"]) == want, y["phase_ms"]
    assert all(v >= 0 for v in y["phase_ms"].values()), y["phase_ms"]
    for k in ("loss", "aux_loss", "grad_norm"):
        assert x[k] == y[k], (k, x[k], y[k])
print("phase_ms ok, losses equal")
PY
)"
check "metrics phase_ms has every phase; losses equal the untimed run's" 0 $? \
  "phase_ms ok, losses equal" "$out"
finish
