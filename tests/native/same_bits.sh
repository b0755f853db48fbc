#!/usr/bin/env bash
# A build for the machine's own instruction set (-march=native: FMA, AVX-512 where the CPU
# has them) computes the same bits as the baseline build: no multiply is fused into an add
# outside the target-cloned kernels, which run the same clone in both (CMakeLists.txt,
# -ffp-contract). Compares every tensor that check-layer dumps (every schedule, fused and
# not, fp32 and bf16) and the losses of a short training run. scripts/test builds the native
# binary in build-native and runs this after CTest.
#   bash same_bits.sh <baseline parm> <source dir> <native parm>
source "$2/tests/cli/lib/checks.bash" "$1" "$2"
native="$3"

# dumps <binary> <dir> <extra check-layer args...>: every schedule's tensors into dir.
dumps() {
  local bin="$1" dir="$2"
  shift 2
  PARM_BIN="$bin" prun -n 4 -- check-layer --mp 2 --ep 2 --esp 2 --tokens 64 --model-dim 32 \
    --hidden 64 --experts 4 --topk 2 --capacity-factor 1.0 --fuse both --dump "$dir" "$@"
}
# same_files <name> <dir a> <dir b>: every .npy of a is in b with the same bytes.
same_files() {
  local diffs="" n=0
  for f in "$2"/*.npy; do
    n=$((n + 1))
    cmp -s "$f" "$3/$(basename "$f")" || diffs="$diffs $(basename "$f")"
  done
  check "$1: $n tensors, every one bit-identical" 0 "$([ -z "$diffs" ] && [ $n -gt 0 ] && echo 0 || echo 1)" \
    "" "differ:$diffs"
}

for precision in fp32 bf16; do
  out_a="$(dumps "$parm" "$tmp/base-$precision" --precision "$precision")"
  rc_a=$?
  out_b="$(dumps "$native" "$tmp/native-$precision" --precision "$precision")"
  rc_b=$?
  check "check-layer $precision, baseline build" 0 "$rc_a" "dumped to" "$out_a"
  check "check-layer $precision, native build" 0 "$rc_b" "dumped to" "$out_b"
  same_files "check-layer $precision" "$tmp/base-$precision" "$tmp/native-$precision"
done

# losses <binary> <metrics file>: 6 steps of the built-in model on 4 ranks (mp 2 ep 2 esp 2).
losses() {
  PARM_BIN="$1" prun -n 4 -- train --config gpt2-moe-tiny --mp 2 --ep 2 --esp 2 --steps 6 \
    --micro-batch 2 --eval-every 3 --metrics "$2" >/dev/null
  grep -o '"\(loss\|aux_loss\|val_loss\|grad_norm\)":[^,}]*' "$2"
}
la="$(losses "$parm" "$tmp/base.jsonl")"
lb="$(losses "$native" "$tmp/native.jsonl")"
check "training: the baseline build reports losses" 0 "$([ -n "$la" ] && echo 0 || echo 1)" "" "$la"
check "training: losses and gradient norms bit-identical" 0 "$([ "$la" = "$lb" ] && echo 0 || echo 1)" \
  "" "$(diff <(echo "$la") <(echo "$lb"))"

finish
