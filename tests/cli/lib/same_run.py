"""same_run.py <a.jsonl> <b.jsonl> [first step]: two runs' metrics are equal bit for bit (the
JSON numbers round-trip doubles): loss, aux_loss, grad_norm and val_loss of every step from
`first step` on; exits 1 naming the first difference, or when the files share no step."""
import json
import sys

a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1
steps = sorted(s for s in a if s >= first and s in b)
if not steps:
    print("no common steps")
    sys.exit(1)
for s in steps:
    for key in ("loss", "aux_loss", "grad_norm", "val_loss"):
        if a[s].get(key) != b[s].get(key):
            print(f"step {s}: {key} {a[s].get(key)!r} != {b[s].get(key)!r}")
            sys.exit(1)
print(f"steps {steps[0]}..{steps[-1]}: loss, aux_loss, grad_norm, val_loss bit-identical")
