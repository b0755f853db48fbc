# bench/gpu-check's training stages (issue 16), sourced by bench/gpu-check after its helpers
# (log, fail, run, parm, show_failure, over_budget, $py, $res, $root, $have_parm). Each stage
# is one function with its own time limits (seconds, the sum about 150 s on an H200):
#   train_track   30 steps of gpt2-moe-tiny on README.md, fp32, 2 ranks: the whole model on
#                 the GPU (--comm mpi) against the CPU; step 30's loss to 1e-4 relative
#   train_resume  a GPU run resumes a CPU checkpoint and the reverse: the step after the
#                 resume on either device equals the other device's to 1e-5 relative
#   train_tokens  tokens/s of gpt2-moe-tiny --micro-batch 64 bf16 on 1 rank of the GPU
#                 (--comm nccl) against the CPU main-job layout (4 ranks, mp 2 ep 2 esp 2, s1);
#                 target: >= 10x
#   train_small   configs/gpt2-small-moe.json on 1 rank, bf16: tokens/s, MFU (the progress
#                 line's, against the GPU's measured bf16 GEMM rate; target >= 40%), the
#                 peak GPU memory (nvidia-smi, sampled every 200 ms; target <= 40 GiB), and the
#                 per-phase split of a second, shorter run with --phase-times
# Results: $res/train-*.log and .jsonl, and $res/train-summary.txt.

# loss_check FILE_A FILE_B STEP TOL LABEL: step STEP's loss of two metrics files agree to TOL
# relative; prints a verdict line, returns 1 when they do not.
loss_check() {
  "$py" - "$@" <<'PY'
import json, sys
fa, fb, step, tol, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def at(f):
    for line in open(f):
        m = json.loads(line)
        if m["step"] == step:
            return m
    sys.exit(f"{label}: no step {step} in {f}")
a, b = at(fa), at(fb)
rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
print(f"{label}: step {step} loss {a['loss']:.7f} vs {b['loss']:.7f} (rel {rel:.1e}, tolerance {tol:g})")
sys.exit(0 if rel <= tol else 1)
PY
}

train_track() {
  over_budget "train_track" && return
  local args=(train --mp 1 --ep 2 --esp 1 --steps 30 --corpus "file:$root/README.md"
              --eval-every 0 --precision fp32)
  log "stage train_track: 30 steps gpt2-moe-tiny, 2 ranks, cpu vs the whole model on cuda"
  parm train-track-cpu 2 120 "${args[@]}" --device cpu --metrics "$res/train-track-cpu.jsonl"
  local rc_cpu=$?
  parm train-track-cuda 2 120 "${args[@]}" --device cuda --comm mpi \
    --metrics "$res/train-track-cuda.jsonl"
  local rc_gpu=$?
  if [ $rc_cpu -ne 0 ] || [ $rc_gpu -ne 0 ]; then
    fail "train_track: cpu rc $rc_cpu, cuda rc $rc_gpu"
    [ $rc_gpu -ne 0 ] && show_failure "$res/train-track-cuda.log"
    return
  fi
  local v
  if v="$(loss_check "$res/train-track-cpu.jsonl" "$res/train-track-cuda.jsonl" 30 1e-4 \
            "train_track")"; then log "  $v"; else fail "$v"; fi
  echo "$v" >>"$res/train-summary.txt"
}

train_resume() {
  over_budget "train_resume" && return
  local ck="$res/train-resume-ck"
  rm -rf "$ck"
  local args=(train --mp 1 --ep 2 --esp 1 --corpus "file:$root/README.md" --eval-every 0
              --precision fp32)
  log "stage train_resume: cuda resumes a cpu checkpoint and the reverse"
  local ok=1
  parm resume-cpu4 2 60 "${args[@]}" --device cpu --steps 4 --save-dir "$ck/cpu" || ok=0
  parm resume-cuda6 2 60 "${args[@]}" --device cuda --comm mpi --steps 6 \
    --resume "$ck/cpu" --save-dir "$ck/cuda" --metrics "$res/train-resume-cuda.jsonl" || ok=0
  parm resume-cpu6 2 60 "${args[@]}" --device cpu --steps 6 --resume "$ck/cpu" \
    --metrics "$res/train-resume-cpu.jsonl" || ok=0
  parm resume-cpu7 2 60 "${args[@]}" --device cpu --steps 7 --resume "$ck/cuda" \
    --metrics "$res/train-resume-back-cpu.jsonl" || ok=0
  parm resume-cuda7 2 60 "${args[@]}" --device cuda --comm mpi --steps 7 --resume "$ck/cuda" \
    --metrics "$res/train-resume-back-cuda.jsonl" || ok=0
  if [ $ok -eq 0 ]; then
    fail "train_resume: a run failed (see $res/resume-*.log)"
    return
  fi
  local v1 v2
  v1="$(loss_check "$res/train-resume-cpu.jsonl" "$res/train-resume-cuda.jsonl" 5 1e-5 \
          "train_resume cpu checkpoint on cuda")" || fail "$v1"
  v2="$(loss_check "$res/train-resume-back-cuda.jsonl" "$res/train-resume-back-cpu.jsonl" 7 \
          1e-5 "train_resume cuda checkpoint on cpu")" || fail "$v2"
  log "  $v1"
  log "  $v2"
  printf '%s\n%s\n' "$v1" "$v2" >>"$res/train-summary.txt"
}

# tokens_per_s FILE: the mean tokens/s of a metrics file's steps after the first two.
tokens_per_s() {
  "$py" -c "
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])][2:]
print(f\"{sum(x['tokens_per_s'] for x in m) / max(1, len(m)):.0f}\")" "$1"
}

train_tokens() {
  over_budget "train_tokens" && return
  log "stage train_tokens: gpt2-moe-tiny mb 64 bf16 on 1 GPU rank vs the CPU main-job layout"
  local base=(train --config gpt2-moe-tiny --corpus "file:$root/README.md" --eval-every 0
              --steps 20 --log-every 5)
  parm train-tokens-cuda 1 120 "${base[@]}" --mp 1 --ep 1 --esp 1 --device cuda --comm nccl \
    --precision bf16 --micro-batch 64 --schedule s1 --metrics "$res/train-tokens-cuda.jsonl"
  local rc_gpu=$?
  parm train-tokens-cpu 4 120 "${base[@]}" --device cpu --mp 2 --ep 2 --esp 2 --schedule s1 \
    --metrics "$res/train-tokens-cpu.jsonl"
  local rc_cpu=$?
  if [ $rc_cpu -ne 0 ] || [ $rc_gpu -ne 0 ]; then
    fail "train_tokens: cpu rc $rc_cpu, cuda rc $rc_gpu"
    [ $rc_gpu -ne 0 ] && show_failure "$res/train-tokens-cuda.log"
    return
  fi
  local g c
  g=$(tokens_per_s "$res/train-tokens-cuda.jsonl")
  c=$(tokens_per_s "$res/train-tokens-cpu.jsonl")
  local v="train_tokens: cuda 1 rank bf16 mb 64 $g tok/s, cpu 4 ranks main-job layout $c tok/s: $("$py" -c "print(f'{$g / max(1, $c):.1f}x (target 10x)')")"
  log "  $v"
  echo "$v" >>"$res/train-summary.txt"
}

train_small() {
  over_budget "train_small" && return
  log "stage train_small: configs/gpt2-small-moe.json, 1 rank, bf16, 12 steps"
  local mem="$res/train-small-mem.csv"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$mem" 2>/dev/null &
  local smi=$!
  # A corpus whose 1% validation split still holds a 1024-token sequence.
  cat "$root"/README.md "$root"/docs/*.md "$root"/src/*/*.cpp >"$res/train-small-corpus.txt"
  parm train-small 1 240 train --config "$root/configs/gpt2-small-moe.json" \
    --corpus "file:$res/train-small-corpus.txt" --mp 1 --ep 1 --esp 1 --schedule s1 --fuse off \
    --grad-accum 1 --steps 12 --log-every 1 --eval-every 0 --save-every 0 \
    --device cuda --comm nccl --precision bf16 --metrics "$res/train-small.jsonl"
  local rc=$?
  # The per-phase split from 4 more steps with --phase-times (each phase waits for the GPU,
  # so the MFU above comes from the untimed run).
  [ $rc -eq 0 ] && parm train-small-phases 1 180 train --config "$root/configs/gpt2-small-moe.json" \
    --corpus "file:$res/train-small-corpus.txt" --mp 1 --ep 1 --esp 1 --schedule s1 --fuse off \
    --grad-accum 1 --steps 4 --log-every 1 --eval-every 0 --save-every 0 \
    --device cuda --comm nccl --precision bf16 --phase-times \
    --metrics "$res/train-small-phases.jsonl" ||
    fail "train_small: --phase-times run (see $res/train-small-phases.log)"
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  if [ $rc -ne 0 ]; then
    fail "train_small: rc $rc (see $res/train-small.log)"
    show_failure "$res/train-small.log"
    return
  fi
  local v
  v="$("$py" - "$res/train-small.jsonl" "$mem" "$res/train-small-phases.jsonl" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])][2:]
n = max(1, len(m))
tps = sum(x["tokens_per_s"] for x in m) / n
mfu = sum(x["mfu"] for x in m) / n
mib = [int(x) for x in open(sys.argv[2]).read().split() if x.strip().isdigit()]
peak = max(mib) / 1024 if mib else float("nan")
try:
    ph = [json.loads(l)["phase_ms"] for l in open(sys.argv[3])][-1]
    phases = ", phases (ms) " + " ".join(f"{k} {v:.0f}" for k, v in ph.items())
except Exception as e:
    phases = f", no phase split ({e})"
print(f"train_small: {tps:.0f} tok/s, MFU {100 * mfu:.1f}% (target 40%), "
      f"step {sum(x['step_ms'] for x in m) / n:.0f} ms (comm {sum(x['comm_ms'] for x in m) / n:.0f}), "
      f"peak GPU memory {peak:.1f} GiB (target 40){phases}")
PY
)"
  log "  $v"
  echo "$v" >>"$res/train-summary.txt"
}
