#!/usr/bin/env bash
# --precision bf16 on the CPU end to end (issue 19): training at bf16 (bf16 operands for the
# expert and dense products, fp32 accumulation, master weights and optimizer) follows the
# fp32 losses of the same run, on 2 ranks (ep = 2) and on the main job's layout (4 ranks,
# mp = esp = ep = 2); the losses are not bit-identical (the bf16 products did run); `parm
# info` and bench-layer name the bf16 kernel. The 100-step gpt2-moe-tiny comparison is too
# slow for CI: docs/bf16-cpu.md reports it.
#   bash train_bf16.sh <path to parm> <source dir>
set -uo pipefail
parm="$1"
src="$2"
export PARM_BIN="$parm"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fails=0
passes=0
ok() { echo "ok:   $*"; passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat >"$work/cfg.json" <<JSON
{
  "name": "test-tiny",
  "model": {"arch": "gpt2", "seq_len": 32, "model_dim": 64, "num_heads": 4, "num_layers": 2,
            "ffn_hidden": 128, "moe_every": 2, "experts": 4, "expert_hidden": 64, "topk": 2,
            "capacity_factor": "1.25", "seed": 3},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 60, "micro_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 10},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON

# track <fp32.jsonl> <bf16.jsonl>: the last step within 2%, the mean of the last 10 within 1%,
# every step within 5%, and at least one step not bit-identical.
track() {
  python3 - "$@" <<'PY'
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
steps = sorted(s for s in a if s in b)
if len(steps) < 10: print(f"only {len(steps)} common steps"); sys.exit(1)
rel = lambda x, y: abs(x - y) / abs(x)
last = rel(a[steps[-1]], b[steps[-1]])
tail = rel(sum(a[s] for s in steps[-10:]), sum(b[s] for s in steps[-10:]))
worst = max(rel(a[s], b[s]) for s in steps)
same = all(a[s] == b[s] for s in steps)
print(f"step {steps[-1]}: fp32 {a[steps[-1]]:.4f} bf16 {b[steps[-1]]:.4f} ({last:.2%}); "
      f"last-10 mean {tail:.2%}; worst step {worst:.2%}{'; IDENTICAL' if same else ''}")
sys.exit(0 if last <= 0.02 and tail <= 0.01 and worst <= 0.05 and not same else 1)
PY
}

for layout in "2 --mp 1 --ep 2 --esp 1" "4 --mp 2 --ep 2 --esp 2"; do
  set -- $layout
  n=$1
  shift
  for p in fp32 bf16; do
    "$src/scripts/parmrun" -n "$n" --timeout 300 -- train --config "$work/cfg.json" "$@" \
      --precision $p --metrics "$work/$p.jsonl" >"$work/$p.log" 2>&1 \
      || { bad "np$n $* $p: run failed"; tail -5 "$work/$p.log"; }
  done
  if out=$(track "$work/fp32.jsonl" "$work/bf16.jsonl"); then ok "np$n $*: $out"; else bad "np$n $*: $out"; fi
done

if "$src/scripts/parmrun" -n 1 -- info 2>&1 | grep -q "^bf16: *cpu .*amx_bf16.*parm runs"; then
  ok "parm info names the CPU's bf16 support and the bf16 kernel"
else
  bad "parm info has no bf16 line"
fi
if "$src/scripts/parmrun" -n 2 -- bench-layer --ep 2 --tokens 64 --model-dim 32 --hidden 64 \
     --experts 4 --topk 2 --schedule s2 --iters 1 --warmup 1 --precision bf16 2>&1 \
     | grep -q "^# bf16 products: parm "; then
  ok "bench-layer --precision bf16 names the bf16 kernel"
else
  bad "bench-layer --precision bf16 does not name the bf16 kernel"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
