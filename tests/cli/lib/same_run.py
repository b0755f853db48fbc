"""same_run.py <a.jsonl> <b.jsonl>: the metrics files hold the same steps with bit-identical
losses and l_aux (the JSON numbers round-trip doubles); exits 1 if not. Used by
tests/cli/train_recompute.sh."""
import json
import sys

a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
if [r["step"] for r in a] != [r["step"] for r in b] or not a:
    print("the runs have different steps")
    sys.exit(1)
for ra, rb in zip(a, b):
    for key in ("loss", "aux_loss", "grad_norm"):
        if ra[key] != rb[key]:
            print(f"step {ra['step']}: {key} {ra[key]!r} != {rb[key]!r}")
            sys.exit(1)
print(f"steps 1..{a[-1]['step']}: loss, aux_loss and grad_norm bit-identical")
