#!/usr/bin/env bash
# --precision bf16 on the CPU end to end (issue 19): training at bf16 (bf16 operands for the
# expert and dense products, fp32 accumulation, master weights and optimizer) follows the
# fp32 losses of the same run, on 2 ranks (ep = 2) and on the main job's layout (4 ranks,
# mp = esp = ep = 2); the losses are not bit-identical (the bf16 products did run); `parm
# info` and bench-layer name the bf16 kernel; MFU divides by the bf16 GEMM rate at bf16;
# check-layer, bench-layer and train take swiglu experts with a shared expert at bf16. The
# 100-step gpt2-moe-tiny comparison is too
# slow for CI: docs/bf16-cpu.md reports it.
#   bash train_bf16.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

# track <fp32.jsonl> <bf16.jsonl>: the last step within 2%, the mean of the last 10 within
# 1%, every step within 5%, and at least one step not bit-identical. Prints "tracks: ...".
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
good = last <= 0.02 and tail <= 0.01 and worst <= 0.05 and not same
print(f"{'tracks' if good else 'DIVERGES'}: step {steps[-1]} fp32 {a[steps[-1]]:.4f} bf16 "
      f"{b[steps[-1]]:.4f} ({last:.2%}); last-10 mean {tail:.2%}; worst step {worst:.2%}"
      f"{'; bit-identical: bf16 did not run' if same else ''}")
PY
}

for layout in "2 --mp 1 --ep 2 --esp 1" "4 --mp 2 --ep 2 --esp 2"; do
  set -- $layout
  n=$1
  shift
  for p in fp32 bf16; do
    # The built-in gpt2-moe-tiny, on short runs of small batches.
    out=$(prun -n "$n" -- train --config gpt2-moe-tiny --steps 40 --micro-batch 2 \
          --eval-every 0 "$@" --precision $p --metrics "$tmp/$p.jsonl")
    check "train np$n $* --precision $p" 0 $? "summary" "$out"
    # MFU divides by the rate of the products that run: the bf16 kernel's at bf16.
    want="GFLOP/s per rank (measured at start)"
    [ $p = bf16 ] && want="GFLOP/s per rank (bf16 GEMM measured at start, parm "
    check "train np$n --precision $p: MFU against the $p GEMM rate" 0 0 "$want" "$out"
  done
  out=$(track "$tmp/fp32.jsonl" "$tmp/bf16.jsonl" 2>&1)
  check "np$n $*: bf16 follows fp32 ($out)" 0 0 "tracks:" "$out"
done

out=$(prun -n 1 -- info)
check "parm info names the CPU's bf16 support and the bf16 kernel" 0 $? "; products: parm " "$out"
out=$(prun -n 2 -- bench-layer --ep 2 --tokens 64 --model-dim 32 --hidden 64 --experts 4 \
      --topk 2 --schedule s2 --iters 1 --warmup 1 --precision bf16)
check "bench-layer --precision bf16 names the bf16 kernel" 0 $? "# bf16 products: parm " "$out"

# SwiGLU experts with a shared expert at bf16 (docs/spec.md §8-9): check-layer passes within
# the bf16 tolerance (mp = esp = ep = 2, every schedule, the shared gate on), bench-layer and
# a short train run.
swiglu="--precision bf16 --expert-mlp swiglu --shared-experts 1"
out=$(prun -n 4 -- check-layer --mp 2 --ep 2 --esp 2 --tokens 32 --model-dim 40 --hidden 72 \
      --experts 4 --topk 2 --schedule all --shared-hidden 36 --shared-gate on $swiglu)
check "check-layer $swiglu --shared-gate on at mp 2 ep 2 esp 2" 0 $? "s1 (fused): PASS" "$out"
check "check-layer $swiglu: at bf16" 0 0 "device cpu, bf16 products" "$out"
check "check-layer $swiglu: the shared gate's gradient checked" 0 0 "dswg" "$out"
out=$(prun -n 2 -- bench-layer --ep 2 --tokens 64 --model-dim 32 --hidden 64 --experts 4 \
      --topk 2 --schedule s2 --iters 1 --warmup 1 $swiglu)
check "bench-layer $swiglu" 0 $? "# bf16 products: parm " "$out"
out=$(prun -n 2 -- train --config gpt2-moe-tiny --steps 3 --micro-batch 2 --eval-every 0 \
      --mp 1 --ep 2 --esp 1 --shared-hidden 64 $swiglu)
check "train $swiglu" 0 $? "summary" "$out"

finish
