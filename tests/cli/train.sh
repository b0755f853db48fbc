#!/usr/bin/env bash
# End-to-end training tests (issue 7): (a) parallel runs follow the single-process losses,
# (b) resume is bit-exact, (c) a checkpoint saved on one layout loads on another, (d) bad
# checkpoints and configs are refused, an interrupted save leaves the previous checkpoint
# usable, (e) a rank that dies ends the whole job with a message naming it, (f) --aux-loss
# global equals one process with the replicas' micro-batches concatenated and --aux-loss
# sequence B one-sequence micro-batches, (g) the presets
# track one process over 100 steps and their checkpoints (swiglu's w3) load on another layout.
#   bash train.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"
work="$tmp"

# A small, fast model: the tiny config with 2 layers and short sequences.
cat >"$work/cfg.json" <<JSON
{
  "name": "test-tiny",
  "model": {"arch": "gpt2", "seq_len": 32, "model_dim": 64, "num_heads": 4, "num_layers": 2,
            "ffn_hidden": 128, "moe_every": 2, "experts": 4, "expert_hidden": 64, "topk": 2,
            "capacity_factor": "1.25", "seed": 3},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 6, "micro_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 1},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON

train() {  # train <ranks> <log> <parm train args...>
  local n="$1" log="$2"
  shift 2
  "$src/scripts/parmrun" -n "$n" --job-timeout 300 -- train --config "$work/cfg.json" "$@" >"$log" 2>&1
}

# compare <a.jsonl> <b.jsonl> <rel tol> [first step]: losses equal step by step.
compare() { python3 "$src/tests/cli/lib/compare_losses.py" "$@"; }

# (a) Equivalence with the single-process run. A DP run of N_DP replicas accumulating 4/N_DP
# micro-batches each equals one process accumulating 4 (the same micro-batches, gated the
# same way).
tol=2e-4
for f in 1.25 2.0; do
  train 1 "$work/ref$f.log" --steps 10 --grad-accum 4 --capacity-factor $f --metrics "$work/ref$f.jsonl" \
    || { bad "single-process reference run f=$f"; cat "$work/ref$f.log"; }
done
for layout in "2 --mp 2 --esp 2 --ep 1" "2 --mp 1 --ep 2" "4 --mp 2 --esp 2 --ep 2" "4 --mp 2 --ep 2 --esp 1" "4 --mp 1 --ep 4"; do
  set -- $layout
  n=$1
  shift
  dp=$((n / $2))
  accum=$((4 / dp))
  for sched in baseline s1 s2; do
    f=1.25
    [ "$sched" = s1 ] && f=2.0  # S1 gates per slice: equal to the single process when nothing drops
    name="np$n $* $sched"
    log="$work/run.log"
    if ! train "$n" "$log" --steps 10 --grad-accum $accum "$@" --schedule $sched --capacity-factor $f --metrics "$work/run.jsonl"; then
      if grep -q "use --schedule s1 or s2" "$log"; then continue; fi
      bad "(a) $name: run failed"; tail -5 "$log"; continue
    fi
    if out=$(compare "$work/run.jsonl" "$work/ref$f.jsonl" $tol); then ok "(a) $name: $out"; else bad "(a) $name: $out"; fi
  done
done

# (b) Resume is bit-exact; (e) a dying rank ends the job with a message naming it.
train 4 "$work/full.log" --mp 2 --esp 2 --ep 2 --metrics "$work/full.jsonl" || bad "(b) uninterrupted run"
rm -rf "$work/ck"
if PARM_FAULT=kill_rank=1,kill_at_step=4 train 4 "$work/die.log" --mp 2 --esp 2 --ep 2 --save-dir "$work/ck" --save-every 3 --metrics "$work/part.jsonl"; then
  bad "(e) the job with a dying rank exited 0"
elif grep -q "rank 1" "$work/die.log"; then
  ok "(e) a rank that dies ends the job, named in the output: $(grep -m1 'rank 1' "$work/die.log")"
else
  bad "(e) no message naming rank 1"; tail -5 "$work/die.log"
fi
if train 4 "$work/resume.log" --mp 2 --esp 2 --ep 2 --save-dir "$work/ck" --resume --metrics "$work/resumed.jsonl"; then
  if out=$(compare "$work/resumed.jsonl" "$work/full.jsonl" 0 4); then ok "(b) resume bit-exact: $out"; else bad "(b) resume: $out"; fi
else
  bad "(b) resume failed"; tail -5 "$work/resume.log"
fi

# (c) Saved on mp=2 esp=2 ep=2 (4 ranks), loaded on mp=1 ep=2 (2 ranks): same next step.
if train 2 "$work/c.log" --mp 1 --ep 2 --resume "$work/ck/step-00000003" --metrics "$work/other.jsonl"; then
  if out=$(compare "$work/other.jsonl" "$work/full.jsonl" $tol 4); then ok "(c) other layout: $out"; else bad "(c) other layout: $out"; fi
else
  bad "(c) loading on another layout failed"; tail -5 "$work/c.log"
fi

# (d) Refusals.
expect_refusal() {  # expect_refusal <what> <text> <parm train args...>
  local what="$1" text="$2"
  shift 2
  if train 2 "$work/d.log" --mp 1 --ep 2 "$@"; then
    bad "(d) $what: accepted"
  elif grep -qF -- "$text" "$work/d.log"; then
    ok "(d) $what: $(grep -m1 -F -- "$text" "$work/d.log" | cut -c1-150)"
  else
    bad "(d) $what: message lacks '$text'"; tail -3 "$work/d.log"
  fi
}
cp -r "$work/ck/step-00000003" "$work/corrupt"
f0=$(ls "$work/corrupt/tensors" | head -1)
# Flip one bit of byte 5 (writing a fixed value leaves the file as it was when that byte
# already holds it).
b5=$(od -An -tu1 -j5 -N1 "$work/corrupt/tensors/$f0" | tr -d ' ')
printf "\\x$(printf %02x $((b5 ^ 1)))" | dd of="$work/corrupt/tensors/$f0" bs=1 seek=5 conv=notrunc status=none
cmp -s "$work/corrupt/tensors/$f0" "$work/ck/step-00000003/tensors/$f0" && bad "(d) corrupting $f0 left it unchanged"
expect_refusal "corrupt checkpoint" "checksum mismatch" --resume "$work/corrupt"
cp -r "$work/ck/step-00000003" "$work/trunc"
truncate -s 10 "$work/trunc/tensors/$f0"
expect_refusal "truncated checkpoint" "missing or truncated" --resume "$work/trunc"
expect_refusal "mismatched checkpoint" "saved for a different model" --resume "$work/ck/step-00000003" --config bert-moe-tiny --esp 1
expect_refusal "no checkpoint" "no checkpoint at" --resume "$work/nothing"
echo '{"model": {"layers": 3}}' >"$work/badkey.json"
expect_refusal "unknown config key" "unknown key" --config "$work/badkey.json"
echo '{"model": ' >"$work/badjson.json"
expect_refusal "broken JSON" "not valid JSON" --config "$work/badjson.json"
expect_refusal "missing corpus" "corpus file:/nonexistent" --corpus file:/nonexistent

# An interrupted save leaves the previous checkpoint usable.
rm -rf "$work/ck2"
train 2 "$work/s1.log" --mp 1 --ep 2 --steps 2 --save-dir "$work/ck2" || bad "(d) first save"
PARM_FAULT=crash_save_after_files=2 train 2 "$work/s2.log" --mp 1 --ep 2 --steps 4 --save-dir "$work/ck2" --resume
if [ "$(cat "$work/ck2/latest")" = "step-00000002" ] && [ ! -e "$work/ck2/step-00000004" ] &&
   train 2 "$work/s3.log" --mp 1 --ep 2 --steps 4 --save-dir "$work/ck2" --resume; then
  ok "(d) interrupted save: latest still step-00000002 and it resumes"
else
  bad "(d) interrupted save left no usable checkpoint"; ls "$work/ck2"; tail -3 "$work/s3.log"
fi

# --router-bias-update: the router bias is part of the checkpoint, so resume is bit-exact;
# a checkpoint without it (the bias dropped from its manifest) loads with zero bias, which
# then differs.
rb="--mp 1 --ep 2 --router-bias-update 0.05"
train 2 "$work/rb_full.log" $rb --metrics "$work/rb_full.jsonl" || bad "(b) router bias: uninterrupted run"
# The same run, stopped after step 3's checkpoint (the learning-rate schedule spans 6 steps).
PARM_FAULT=kill_rank=1,kill_at_step=4 train 2 "$work/rb_half.log" $rb --save-dir "$work/rbck" --save-every 3
[ -e "$work/rbck/step-00000003/manifest.json" ] || bad "(b) router bias: no step-3 checkpoint"
if train 2 "$work/rb_res.log" $rb --save-dir "$work/rbck" --resume "$work/rbck/step-00000003" --metrics "$work/rb_res.jsonl"; then
  if out=$(compare "$work/rb_res.jsonl" "$work/rb_full.jsonl" 0 4); then ok "(b) router bias resume bit-exact: $out"; else bad "(b) router bias resume: $out"; fi
else
  bad "(b) router bias resume failed"; tail -5 "$work/rb_res.log"
fi
cp -r "$work/rbck/step-00000003" "$work/rb_old"
python3 -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); assert 'router_bias' in m; del m['router_bias']; json.dump(m, open(p, 'w'))" "$work/rb_old/manifest.json" \
  || bad "(b) router bias missing from the manifest"
if train 2 "$work/rb_old.log" $rb --resume "$work/rb_old" --metrics "$work/rb_old.jsonl"; then
  if compare "$work/rb_old.jsonl" "$work/rb_full.jsonl" 0 4 >/dev/null; then bad "(b) zero bias resumed like the saved bias"; else ok "(b) checkpoint without router_bias loads (zero bias)"; fi
else
  bad "(b) checkpoint without router_bias refused"; tail -5 "$work/rb_old.log"
fi

# (f) --aux-loss global: l_aux over every replica's tokens, so N_DP replicas of micro-batch
# 8/N_DP train like one process with micro-batch 8 (dropless: the same tokens reach the same
# experts); the default micro-batch scope does not (l_aux weighted 1.0 to make it show).
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['model']['aux_loss_coeff']=1.0; json.dump(c, open(sys.argv[2], 'w'))" \
  "$work/cfg.json" "$work/aux.json"
aux() {  # aux <ranks> <log> <args...>
  local n="$1" log="$2"
  shift 2
  "$src/scripts/parmrun" -n "$n" --job-timeout 300 -- train --config "$work/aux.json" --steps 6 --capacity-factor none "$@" >"$log" 2>&1
}
aux 1 "$work/aux1.log" --micro-batch 8 --aux-loss global --metrics "$work/aux1.jsonl" || bad "(f) single-process global run"
for layout in "2 --ep 2" "4 --mp 2 --ep 2 --esp 1 --schedule s1"; do
  set -- $layout
  n=$1
  shift
  if ! aux "$n" "$work/aux.log" --micro-batch 4 --aux-loss global "$@" --metrics "$work/aux.jsonl"; then
    bad "(f) np$n $* global: run failed"; tail -5 "$work/aux.log"; continue
  fi
  if out=$(compare "$work/aux.jsonl" "$work/aux1.jsonl" 1e-5); then ok "(f) np$n $* --aux-loss global: $out"; else bad "(f) np$n $* global: $out"; fi
done
if aux 2 "$work/aux.log" --micro-batch 4 --ep 2 --metrics "$work/aux.jsonl"; then
  if out=$(compare "$work/aux.jsonl" "$work/aux1.jsonl" 1e-5); then bad "(f) the micro-batch scope trained like global: $out"; else ok "(f) np2 --aux-loss micro-batch differs from global"; fi
else
  bad "(f) np2 micro-batch run failed"; tail -5 "$work/aux.log"
fi
# --aux-loss sequence: l_aux of each sequence, averaged, so a micro-batch of 4 sequences trains
# like 4 one-sequence micro-batches accumulated under the micro-batch scope, on one process and
# under mp 2 ep 2 esp 2 (dp 2, micro-batch 2 each); the micro-batch scope on 4 does not.
aux 1 "$work/seq1.log" --micro-batch 1 --grad-accum 4 --metrics "$work/seq1.jsonl" || bad "(f) one-sequence reference run"
for layout in "1 --micro-batch 4" "4 --mp 2 --ep 2 --esp 2 --micro-batch 2 --schedule s1"; do
  set -- $layout
  n=$1
  shift
  if ! aux "$n" "$work/aux.log" --aux-loss sequence "$@" --metrics "$work/aux.jsonl"; then
    bad "(f) np$n $* sequence: run failed"; tail -5 "$work/aux.log"; continue
  fi
  if out=$(compare "$work/aux.jsonl" "$work/seq1.jsonl" 1e-5); then ok "(f) np$n $* --aux-loss sequence: $out"; else bad "(f) np$n $* sequence: $out"; fi
done
if aux 1 "$work/aux.log" --micro-batch 4 --metrics "$work/aux.jsonl"; then
  if out=$(compare "$work/aux.jsonl" "$work/seq1.jsonl" 1e-5); then bad "(f) the micro-batch scope trained like sequence: $out"; else ok "(f) np1 --aux-loss micro-batch differs from sequence"; fi
else
  bad "(f) np1 micro-batch run failed"; tail -5 "$work/aux.log"
fi

# (g) The presets (docs/presets.md): 100 steps of each under mp 2 ep 2 esp 2 (4 ranks, dp 2)
# follow one process with the same global batch. The runs agree to ~1e-8 until a top-k
# near-tie is decided differently by the fp32 rounding of the other layout (measured: step 94
# of mixtral-moe-tiny, 13 of deepseek-moe-tiny, whose 32 experts with top-6 have many more
# near-ties and whose router bias, stepped by the loads' signs, amplifies a flip); from there
# the trajectories part chaotically (to 3e-4 and 1.5e-2). So the first 10 steps are held to
# (a)'s tolerance, every step to 3e-2, and the mean of the last 20 to 1%; a wrong gradient or
# shard leaves those within a few steps.
# mixtral-moe-tiny (f 1.25: drops depend on the gate call's tokens) accumulates the replicas'
# micro-batches one after another; deepseek-moe-tiny (dropless, its router bias updated from
# the step's last micro-batch) takes them as one micro-batch of 16, with l_aux over all of it
# (--aux-loss global: the replicas' l_aux is then the one process's).
for preset in mixtral-moe-tiny deepseek-moe-tiny; do
  p1="$work/$preset.1.jsonl" p4="$work/$preset.4.jsonl"
  one="--grad-accum 2" four=""
  if [ "$preset" = deepseek-moe-tiny ]; then
    one="--micro-batch 16 --aux-loss global" four="--micro-batch 8 --aux-loss global"
  fi
  "$src/scripts/parmrun" -n 1 --job-timeout 300 -- train --config "$preset" --steps 100 \
    --mp 1 --ep 1 --esp 1 $one --schedule s2 --eval-every 0 --metrics "$p1" \
    >"$work/$preset.1.log" 2>&1 || { bad "(g) $preset: one-process run"; continue; }
  "$src/scripts/parmrun" -n 4 --job-timeout 300 -- train --config "$preset" --steps 100 \
    --mp 2 --ep 2 --esp 2 $four --schedule s2 --eval-every 0 --metrics "$p4" \
    --save-dir "$work/$preset.ck" --save-every 50 \
    >"$work/$preset.4.log" 2>&1 || { bad "(g) $preset: mp 2 ep 2 esp 2 run"; continue; }
  if out=$(compare "$p4" "$p1" $tol 1 10); then ok "(g) $preset steps 1-10: $out"; else bad "(g) $preset steps 1-10: $out"; fi
  if out=$(compare "$p4" "$p1" 3e-2); then ok "(g) $preset 100 steps: $out"; else bad "(g) $preset 100 steps: $out"; fi
  if out=$(python3 - "$p4" "$p1" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)][-20:] for p in sys.argv[1:])
ma, mb = sum(a) / len(a), sum(b) / len(b)
print(f"mean loss of the last 20 steps {ma:.4f} against {mb:.4f} (tolerance 1%)")
sys.exit(0 if abs(ma - mb) <= 0.01 * mb else 1)
PY
  ); then ok "(g) $preset: $out"; else bad "(g) $preset: $out"; fi
  # Its step-50 checkpoint, loaded on one process, continues as the 4 ranks did.
  pr="$work/$preset.r.jsonl"
  if "$src/scripts/parmrun" -n 1 --job-timeout 300 -- train --config "$preset" --steps 55 \
    --mp 1 --ep 1 --esp 1 $one --schedule s2 --eval-every 0 --metrics "$pr" \
    --resume "$work/$preset.ck/step-00000050" >"$work/$preset.r.log" 2>&1; then
    if out=$(compare "$pr" "$p4" $tol 51); then ok "(g) $preset checkpoint on one process: $out"; else bad "(g) $preset checkpoint on one process: $out"; fi
  else
    bad "(g) $preset: resume on one process"; tail -3 "$work/$preset.r.log"
  fi
  # ... but not into a model whose experts differ (expert_mlp is omitted at its default).
  out=$("$src/scripts/parmrun" -n 1 --job-timeout 60 -- train --config "$preset" --steps 55 \
    --mp 1 --ep 1 --esp 1 --expert-mlp gelu --resume "$work/$preset.ck/step-00000050" 2>&1)
  check "(g) $preset checkpoint refused by gelu experts" 2 $? \
    'model.expert_mlp is "swiglu" there but its default now' "$out"
done

finish
