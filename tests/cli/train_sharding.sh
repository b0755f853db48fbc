#!/usr/bin/env bash
# The distributed optimizer (issue 39, --optimizer-sharding dp; docs/optimizer.md), on 2 ranks
# (train_sharding_np8.sh has the 8-rank layouts):
# (a) 30 steps of gpt2-moe-tiny and bert-moe-tiny with the AdamW state sharded over dp equal
#     the unsharded run bit for bit under dp 2 (mp 1 ep 2): losses, l_aux, gradient norms,
#     validation losses, and the saved parameters and moments byte for byte; also at bf16;
# (b) checkpoints saved with and without sharding are the same bytes, and each resumes under
#     the other bit-exactly;
# (c) a bad value is refused before any work.
# Micro-batches of 2 sequences (the configs' 8 are 4x slower here).
#   bash train_sharding.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/sharding.bash" "$@"

# (a)
lay="--mp 1 --ep 2 --esp 1 --micro-batch 2"
for cfg in gpt2-moe-tiny bert-moe-tiny; do
  pair 2 "$cfg" "$cfg" $lay --save-every 15
done
pair 2 gpt2-bf16 gpt2-moe-tiny $lay --precision bf16

# (b) The gpt2 runs' step-15 checkpoints.
a="$tmp/gpt2-moe-tiny"
out=$(same_files "$a.ck-dp/step-00000015" "$a.ck-none/step-00000015")
check "(b) step-15 checkpoint saved sharded = unsharded ($out)" 0 $? "identical" "$out"
for from_to in "dp none" "none dp"; do
  set -- $from_to
  out=$(train 2 gpt2-moe-tiny $lay --optimizer-sharding $2 --resume "$a.ck-$1/step-00000015" \
              --metrics "$tmp/r.jsonl")
  check "(b) saved with $1, resumed with $2" 0 $? "resumed from" "$out"
  out=$(same "$tmp/r.jsonl" "$a.none.jsonl" 16)
  check "(b) ... bit-exact ($out)" 0 $? "bit-identical" "$out"
done

# (c)
out=$(prun -n 1 -- train --steps 1 --optimizer-sharding zero2)
check "(c) --optimizer-sharding zero2 refused" 1 $(($? != 0)) \
  "optim.sharding (--optimizer-sharding) 'zero2' is not valid; use none" "$out"

finish
