#!/usr/bin/env bash
# Tokenizers and prepared datasets end to end (issue 40): (a) a BPE tokenizer trained on the
# whole King James text decodes every token of it back to the text, (b) prepare-data writes
# it once and every document round-trips, (c) training on it resumes at the same token under
# another layout, (d) mismatched tokenizers, bad dataset files and an unreachable data
# position are refused naming what is wrong, (e) a config that names a tokenizer kind and
# size trains and prepares them once into the cache.
#   bash data.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"
work="$tmp"

# (a) The tokenizer, and decode(encode(text)) == text on the whole corpus.
out=$(prun -n 1 -- tokenizer train --corpus kjv --vocab 8192 --out "$work/tok.model")
check "(a) tokenizer train" 0 $? "vocabulary 8192" "$out"
out=$(prun -n 1 -- tokenizer check --tokenizer "$work/tok.model" --corpus kjv)
check "(a) BPE round trip on the whole KJV" 0 $? "round trip: identical" "$out"
echo "    $out"
out=$(prun -n 1 -- tokenizer check --tokenizer byte --corpus kjv)
check "(a) byte round trip on the whole KJV" 0 $? "round trip: identical" "$out"

# (b) The prepared dataset.
out=$(prun -n 1 -- prepare-data --tokenizer "$work/tok.model" --corpus kjv --out "$work/ds")
check "(b) prepare-data" 0 $? "round trip: all 31102 documents decode to their text" "$out"
[ -f "$work/ds/tokens.bin" ] && [ -f "$work/ds/dataset.json" ] && [ -f "$work/ds/tokenizer.model" ] \
  && ok "(b) the dataset's files" || bad "(b) the dataset's files are missing"
out=$(prun -n 1 -- prepare-data --tokenizer "$work/tok.model" --corpus kjv --out "$work/ds")
check "(b) prepare-data into an existing folder is refused" 2 $? "exists" "$out"

# (c) Training on it, resumed under another layout.
cat >"$work/cfg.json" <<JSON
{
  "name": "test-bpe",
  "model": {"arch": "gpt2", "seq_len": 32, "model_dim": 64, "num_heads": 4, "num_layers": 2,
            "ffn_hidden": 128, "moe_every": 2, "experts": 4, "expert_hidden": 64, "topk": 2,
            "capacity_factor": "2.0", "seed": 3},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 6, "micro_batch": 4, "grad_accum": 2, "eval_every": 0, "eval_batches": 1,
            "log_every": 1},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON
train() {  # train <ranks> <log> <parm train args...>
  local n="$1" log="$2"
  shift 2
  "$src/scripts/parmrun" -n "$n" --job-timeout 300 -- train --config "$work/cfg.json" "$@" >"$log" 2>&1
}
compare() { python3 "$src/tests/cli/lib/compare_losses.py" "$@"; }
if train 2 "$work/full.log" --mp 1 --ep 2 --tokenizer "$work/tok.model" --data "$work/ds" \
     --save-dir "$work/ck" --save-every 3 --metrics "$work/full.jsonl"; then
  grep -q "vocabulary 8192" "$work/full.log" && ok "(c) trains with the BPE vocabulary" \
    || { bad "(c) the run does not name its tokenizer"; head -3 "$work/full.log"; }
else
  bad "(c) training on the prepared dataset"; tail -5 "$work/full.log"
fi
grep -q '"kind": *"sentencepiece"' "$work/ck/step-00000003/manifest.json" \
  && [ -f "$work/ck/step-00000003/tokenizer.model" ] \
  && ok "(c) the checkpoint records the tokenizer" || bad "(c) the checkpoint lacks the tokenizer"
# parm generate reads the checkpoint's tokenizer back (the copy it keeps): the same text for
# the same seed, text of the corpus's alphabet.
gen() { "$src/scripts/parmrun" -n 1 --job-timeout 120 -- generate --checkpoint "$work/ck/step-00000003" --prompt "And God said" --max-tokens 20 --seed 7 2>/dev/null; }
if g1=$(gen) && g2=$(gen) && [ -n "$g1" ] && [ "$g1" = "$g2" ]; then
  ok "(c) generate decodes with the checkpoint's BPE tokenizer: $(printf '%s' "$g1" | head -c 60 | tr '\n' ' ')"
else
  bad "(c) generate on the BPE checkpoint: '$g1' / '$g2'"
fi
# Another layout (4 ranks, mp 2 x esp 2 x ep 2, dp 2): the same global batch, the same sequences.
if train 4 "$work/res.log" --mp 2 --esp 2 --ep 2 --data "$work/ds" \
     --resume "$work/ck/step-00000003" --metrics "$work/res.jsonl"; then
  if out=$(compare "$work/res.jsonl" "$work/full.jsonl" 2e-4 4); then ok "(c) resume under another layout: $out"; else bad "(c) resume under another layout: $out"; fi
else
  bad "(c) resume under another layout"; tail -5 "$work/res.log"
fi

# (d) Refusals.
refused() {  # refused <name> <text> <parm train args...>
  local name="$1" want="$2"
  shift 2
  local o
  o=$("$src/scripts/parmrun" -n 2 --job-timeout 120 -- train --config "$work/cfg.json" --mp 1 --ep 2 "$@" 2>&1)
  check "(d) $name" 2 $? "$want" "$o"
}
refused "byte tokenizer with a BPE dataset" "--tokenizer byte uses tokenizer (byte" --tokenizer byte --data "$work/ds"
refused "BPE checkpoint resumed with bytes" "checkpoint $work/ck/step-00000003 uses tokenizer (sentencepiece, vocabulary 8192" \
  --resume "$work/ck/step-00000003"
cp -r "$work/ck/step-00000003" "$work/far"
python3 - "$work/far/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["data_position"] = 2**63 - 8
json.dump(m, open(sys.argv[1], "w"))
PY
refused "unreachable data position" "data position 9223372036854775800 cannot be reached by this run" \
  --data "$work/ds" --resume "$work/far"
refused "(the valid range)" "valid data positions for this run: 0 to 9223372036854775759" \
  --data "$work/ds" --resume "$work/far"
cp -r "$work/ds" "$work/bad"
truncate -s 1000 "$work/bad/tokens.bin"
refused "truncated tokens.bin" "prepared dataset $work/bad/tokens.bin: truncated" --data "$work/bad"
printf 'XXXX' | dd of="$work/bad/tokens.bin" conv=notrunc 2>/dev/null
refused "wrong magic" "wrong magic" --data "$work/bad"
refused "a tokenizer file that is not one" "is not a SentencePiece model" --tokenizer "$work/cfg.json" --data "$work/ds"

# (e) A tokenizer kind and size, no files: trained and prepared once into the cache.
python3 - "$work/cfg.json" "$work/cfg-kind.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data"] = {"corpus": "kjv", "tokenizer": {"kind": "unigram", "vocab": 1024}}
c["train"]["steps"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
out=$(prun -n 2 -- train --config "$work/cfg-kind.json" --mp 1 --ep 2 --data-cache "$work/cache")
check "(e) first run makes the cache" 0 $? "data cache: trained a unigram tokenizer of 1024 pieces" "$out"
check "(e) ... and prepares the corpus" 0 0 "data cache: prepared kjv" "$out"
out=$(prun -n 2 -- train --config "$work/cfg-kind.json" --mp 1 --ep 2 --data-cache "$work/cache")
check "(e) the second run reuses it" 0 $? "data cache: using" "$out"
finish
