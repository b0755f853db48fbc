#!/usr/bin/env bash
# The distributed optimizer on 8 ranks (issue 39; train_sharding.sh has the 2-rank tests):
# (a) gpt2-moe-tiny and bert-moe-tiny with the AdamW state sharded equal the unsharded run bit
#     for bit (losses, l_aux, gradient norms, validation losses; parameters and moments byte for
#     byte) under mp 2 ep 2 esp 2 (dp 4, edp 2) and pp 2 x mp 2 ep 2 esp 2 (dp 2, edp 1);
#     10 steps each here (8 ranks on 2 cores: the 30-step runs are in docs/optimizer.md);
# (b) checkpoints move across layouts and shardings: the 8-rank sharded checkpoint resumes on 2
#     ranks without sharding, a 2-rank one under pp 2 with sharding, each following the run
#     that saved it; both shardings of the 2-rank resume agree bit for bit.
#   bash train_sharding_np8.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/sharding.bash" "$@"
steps=10

# (a)
for cfg in gpt2-moe-tiny bert-moe-tiny; do
  pair 8 "$cfg" "$cfg" --mp 2 --ep 2 --esp 2 --micro-batch 2 --save-every 5
  pair 8 "$cfg-pp" "$cfg" --pp 2 --mp 2 --ep 2 --esp 2 --micro-batch 1 --grad-accum 2
done

# (b) The same global batch of 8 sequences on 2 ranks: 2 micro-batches of 2 per replica.
a="$tmp/gpt2-moe-tiny"
for sh in none dp; do
  out=$(train 2 gpt2-moe-tiny --mp 1 --ep 2 --esp 1 --micro-batch 2 --grad-accum 2 \
              --optimizer-sharding $sh --resume "$a.ck-dp/step-00000005" --metrics "$tmp/x-$sh.jsonl" \
              --save-dir "$tmp/x-$sh.ck")
  check "(b) 8-rank sharded checkpoint on 2 ranks, --optimizer-sharding $sh" 0 $? "resumed from" "$out"
done
out=$(compare "$tmp/x-none.jsonl" "$a.none.jsonl" 2e-4 6)
check "(b) ... follows the 8-rank run ($out)" 0 $? "max relative" "$out"
out=$(same "$tmp/x-dp.jsonl" "$tmp/x-none.jsonl")
check "(b) ... the same under both shardings ($out)" 0 $? "bit-identical" "$out"
# Its final checkpoint (2 ranks, sharded) under pp 2 with sharding, and the unsharded one on
# 2 ranks, 2 steps more with the same global batch of 4: they agree.
out=$(steps=12 train 8 gpt2-moe-tiny --pp 2 --mp 2 --ep 2 --esp 2 --micro-batch 2 \
            --optimizer-sharding dp --resume "$tmp/x-dp.ck" --metrics "$tmp/y.jsonl")
check "(b) 2-rank sharded checkpoint under pp 2 x mp 2 ep 2 esp 2, sharded" 0 $? "resumed from" "$out"
out=$(steps=12 train 2 gpt2-moe-tiny --mp 1 --ep 2 --esp 1 --micro-batch 2 \
            --optimizer-sharding none --resume "$tmp/x-none.ck" --metrics "$tmp/y2.jsonl")
check "(b) ... and the unsharded one on 2 ranks" 0 $? "resumed from" "$out"
out=$(compare "$tmp/y.jsonl" "$tmp/y2.jsonl" 2e-4 11)
check "(b) ... agree ($out)" 0 $? "max relative" "$out"

finish
