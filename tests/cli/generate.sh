#!/usr/bin/env bash
# `parm generate` (issue 40): (a) a GPT-2 checkpoint trained here under mp 2 (vocab-parallel
# head) and the same tensors saved again under mp 1 give the same text for the same seed, and
# another seed another text; (b) a BERT checkpoint fills its [MASK]s; (c) bad flags are
# refused before any work, naming the flag and what is valid.
#   bash generate.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

cat >"$tmp/gpt.json" <<JSON
{
  "name": "test-generate",
  "model": {"arch": "gpt2", "seq_len": 32, "model_dim": 32, "num_heads": 4, "num_layers": 2,
            "ffn_hidden": 64, "moe_every": 2, "experts": 4, "expert_hidden": 32, "topk": 2,
            "capacity_factor": "1.25", "seed": 3},
  "optim": {"lr": 0.01, "min_lr": 0.0, "warmup_steps": 2},
  "train": {"steps": 20, "micro_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 10},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON
sed -e 's/"gpt2"/"bert"/' -e 's/test-generate/test-generate-bert/' "$tmp/gpt.json" >"$tmp/bert.json"

# (a) Layout A: mp 2 (each MP rank holds half of the vocabulary's rows). Layout B: mp 1,
# ep 2, resumed from A's checkpoint for one step at a learning rate of 1e-30, which leaves
# every weight as it was (|update| < 1e-29, far below an ulp of any weight): the same
# tensors, saved by another layout.
out=$(prun -n 2 -- train --config "$tmp/gpt.json" --mp 2 --esp 2 --save-dir "$tmp/a")
check "train under mp 2 saves a checkpoint" 0 $? "summary" "$out"
out=$(prun -n 2 -- train --config "$tmp/gpt.json" --ep 2 --resume "$tmp/a" --steps 21 \
      --lr 1e-30 --save-dir "$tmp/b")
check "the checkpoint resaved under mp 1 ep 2" 0 $? "summary" "$out"
a="$tmp/a/$(cat "$tmp/a/latest")"
b="$tmp/b/$(cat "$tmp/b/latest")"
same=1
for f in "$a"/tensors/*.param.bin; do
  cmp -s "$f" "$b/tensors/$(basename "$f")" || same=0
done
if [ $same -eq 1 ] && grep -q '"mp": *2' "$a/manifest.json" && grep -q '"mp": *1' "$b/manifest.json"; then
  ok "the two checkpoints hold the same parameters, saved from mp 2 and mp 1"
else
  bad "the checkpoints of mp 2 and mp 1 differ in their parameters (or layouts)"
fi

gen() { prun -n 1 -- generate --prompt "And God said" --max-tokens 60 "$@"; }
ta=$(gen --checkpoint "$tmp/a" --seed 7)
check "generate from the mp 2 checkpoint" 0 $? "And God said" "$ta"
tb=$(gen --checkpoint "$b" --seed 7)
check "generate from the mp 1 checkpoint" 0 $? "tokens/s" "$tb"
# The text (stdout) without the summary line (stderr, merged by prun); the bytes of an early
# model need not be UTF-8.
text() { grep -av '^generate: ' <<<"$1"; }
if [ "$(text "$ta")" == "$(text "$tb")" ]; then ok "same seed, two layouts: the same text"
else bad "same seed, two layouts: different text: [$(text "$ta")] vs [$(text "$tb")]"; fi
tc=$(gen --checkpoint "$tmp/a" --seed 8)
if [ "$(text "$tc")" != "$(text "$ta")" ]; then ok "another seed: another text"
else bad "seeds 7 and 8 gave the same text"; fi
td=$(gen --checkpoint "$tmp/a" --seed 7 --temperature 0)
te=$(gen --checkpoint "$tmp/a" --seed 9 --temperature 0)
if [ "$(text "$td")" == "$(text "$te")" ]; then ok "temperature 0 does not depend on the seed"
else bad "temperature 0 depends on the seed"; fi
# Past the cache's 32 positions (it refills from the last 16 tokens).
out=$(prun -n 1 -- generate --checkpoint "$tmp/a" --prompt "In the beginning" --max-tokens 100 \
      --top-k 5)
check "100 tokens past a cache of 32 positions, top-k 5" 0 $? "100 tokens" "$out"

# (b) BERT: each [MASK] becomes one byte.
out=$(prun -n 2 -- train --config "$tmp/bert.json" --mp 2 --esp 2 --steps 5 --save-dir "$tmp/bert")
check "train a BERT checkpoint under mp 2" 0 $? "summary" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/bert" --mask --prompt "And [MASK]od said")
check "BERT fills the mask" 0 $? "And " "$out"
line=$(text "$out")
if [ "$(LC_ALL=C; echo ${#line})" -eq 12 ] && ! grep -qF "[MASK]" <<<"$line"; then ok "one byte per [MASK]: [$line]"
else bad "the filled text [$line] is not 12 bytes without [MASK]"; fi

# (c) Refusals.
out=$(prun -n 1 -- generate --checkpoint "$tmp/a" --prompt "x" --mask)
check "--mask on a GPT-2 checkpoint" 2 $? "drop --mask" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/bert" --prompt "x")
check "a BERT checkpoint without --mask" 2 $? "add --mask" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/bert" --prompt "no mask here" --mask)
check "--mask without [MASK]" 2 $? "no [MASK] to fill" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/a" --prompt "x" --temperature -1)
check "a negative temperature" 2 $? "--temperature -1 is not valid" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/a" --prompt "x" --max-tokens 0)
check "--max-tokens 0" 2 $? "--max-tokens 0 is not valid" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/a" --prompt "")
check "an empty prompt" 2 $? "--prompt is empty" "$out"
out=$(prun -n 1 -- generate --checkpoint "$tmp/none" --prompt "x")
check "a missing checkpoint" 2 $? "$tmp/none" "$out"
out=$(prun -n 2 -- generate --checkpoint "$tmp/a" --prompt "x")
check "two ranks" 2 $? "one process" "$out"
finish
