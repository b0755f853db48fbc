"""compare_losses.py <a.jsonl> <b.jsonl> <rel tol> [first step [last step]]: the metrics
files' losses are equal step by step (from `first step` on, up to `last step`) within the
relative tolerance; exits 1 if not,
or if the files share no step. Used by the training CLI tests."""
import json
import sys

a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1
last = int(sys.argv[5]) if len(sys.argv) > 5 else None
la = {r["step"]: r["loss"] for r in a}
lb = {r["step"]: r["loss"] for r in b}
steps = sorted(s for s in la if s >= first and (last is None or s <= last) and s in lb)
if not steps:
    print("no common steps")
    sys.exit(1)
worst = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in steps)
print(f"steps {steps[0]}..{steps[-1]}: max relative loss difference {worst:.3e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
