#!/usr/bin/env bash
# Bad layouts and bad flags are refused before any work, with a message that names what is
# wrong and what would be valid, and a non-zero exit code; no rank hangs.
#   bash bad_input.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

# expect <exit code> <text the output must contain> -- <parmrun args...>
expect() {
  local want_rc="$1" want_text="$2"
  shift 3
  local out rc
  out="$("$src/scripts/parmrun" --job-timeout 120 "$@" 2>&1)"
  rc=$?
  check "parmrun $*" "$want_rc" "$rc" "$want_text" "$out"
}

expect 2 "world size 4 is not divisible by --mp 3" -- -n 4 -- info --mp 3
expect 2 "valid --mp values: 1, 2, 4" -- -n 4 -- info --mp 3
expect 2 "--ep 4 x --esp 2 = 8" -- -n 4 -- info --ep 4 --esp 2
expect 2 "not a multiple of --ranks-per-node 3" -- -n 4 -- info --ranks-per-node 3
expect 2 "--experts 6 is not divisible by --ep 4" -- -n 4 -- bench-layer --ep 4 --experts 6 --tokens 64 --model-dim 16 --hidden 32
expect 2 "--hidden 30 is not divisible by --esp 4" -- -n 4 -- check-layer --esp 4 --mp 4 --hidden 30
expect 2 "--tokens = 30 tokens is not divisible by --mp 4" -- -n 4 -- check-layer --esp 4 --mp 4 --tokens 30
expect 2 "use --schedule s1 or s2" -- -n 4 -- check-layer --mp 2 --esp 4 --schedule baseline
expect 2 "capacity factor" -- -n 2 -- check-layer --capacity-factor 1e3
expect 2 "--schedule 'fast' is not valid" -- -n 2 -- bench-layer --schedule fast
expect 2 "--fuse 'maybe' is not valid" -- -n 2 -- bench-layer --fuse maybe
expect 2 "unknown op 'allscatter'" -- -n 2 -- bench-comm --ops allscatter
# Devices, precisions and communicators.
expect 2 "unknown device 'tpu': valid devices are cpu, cuda" -- -n 1 -- bench-layer --device tpu
expect 2 "unknown precision 'fp16': valid precisions are fp32, bf16" -- -n 1 -- check-layer --precision fp16
expect 2 "unknown communicator 'gloo': valid values are auto, mpi, nccl" -- -n 1 -- bench-layer --comm gloo
expect 2 "--comm nccl moves device buffers and needs --device cuda" -- -n 1 -- check-layer --comm nccl
if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU here: cuda is refused before any work
  expect 2 "use --device cpu" -- -n 2 -- check-layer --device cuda
  expect 2 "use --device cpu" -- -n 1 -- train --device cuda --steps 1
fi
# The router options the CUDA gate has not, refused before the device is looked at.
expect 2 "--router-z-loss (model.router_z_loss) 0.01 with --device cuda" -- -n 1 -- bench-layer --device cuda --router-z-loss 0.01
expect 2 "--router-z-loss (model.router_z_loss) 0.01 with --device cuda" -- -n 1 -- check-layer --device cuda --router-z-loss 0.01
expect 2 "--router-bias-update (model.router_bias_update) 0.001 with --device cuda" -- -n 1 -- train --device cuda --router-bias-update 0.001 --steps 1
# The router's options (docs/spec.md §7), refused with the valid values named.
expect 2 "--router-score (model.router_score) 'relu' is not valid; use softmax or sigmoid" -- -n 1 -- check-layer --router-score relu
expect 2 "--router-topk-norm" -- -n 1 -- check-layer --router-topk-norm maybe
expect 2 "--router-scale (model.router_scale) must be a positive number, got 0" -- -n 1 -- check-layer --router-scale 0
expect 2 "top-k 4 exceeds the 2 experts of the 1 chosen groups" -- -n 1 -- check-layer --experts 8 --topk 4 --router-groups 4 --router-group-topk 1
expect 2 "--router-group-topk (model.router_group_topk) 3 must be in [1, --router-groups = 2]" -- -n 1 -- bench-layer --experts 8 --router-groups 2 --router-group-topk 3
expect 2 "--router-groups (model.router_groups) 3 must divide the 4 experts" -- -n 4 -- train --router-groups 3 --steps 1
expect 2 "run on the CPU layer only" -- -n 1 -- check-layer --device cuda --router-score sigmoid
expect 2 "--aux-loss (model.aux_loss) 'bogus' is not valid; use micro-batch" -- -n 1 -- train --aux-loss bogus --steps 1
# The experts' kind (docs/spec.md §8): the valid ones named; swiglu on the CPU only (fp32
# and bf16: tests/cli/train_bf16.sh runs it).
expect 2 "--expert-mlp (model.expert_mlp) 'relu' is not valid; use gelu or swiglu" -- -n 1 -- check-layer --expert-mlp relu
expect 2 "--expert-mlp (model.expert_mlp) 'relu' is not valid; use gelu or swiglu" -- -n 1 -- train --expert-mlp relu --steps 1
expect 2 "--expert-mlp (model.expert_mlp) swiglu with --device cuda" -- -n 1 -- check-layer --expert-mlp swiglu --device cuda
# Shared experts (docs/spec.md §9): split over mp like the dense FFN; CPU only (fp32 and bf16).
expect 2 "--shared-hidden (model.shared_hidden) 30 is not divisible by --mp 4" -- -n 4 -- check-layer --mp 4 --esp 4 --shared-experts 1 --shared-hidden 30
expect 2 "--shared-gate on (model.shared_gate) needs shared experts" -- -n 1 -- check-layer --shared-gate on
expect 2 "--shared-gate (model.shared_gate)" -- -n 1 -- check-layer --shared-experts 1 --shared-gate maybe
expect 2 "--shared-experts (model.shared_experts) -1 must be in [0, 64]" -- -n 1 -- check-layer --shared-experts -1
# --pad-to-capacity on|off (parallel.pad_to_capacity), as every on/off flag.
expect 2 "--pad-to-capacity 'maybe' is not valid; use on or off" -- -n 1 -- check-layer --pad-to-capacity maybe
expect 2 "--pad-to-capacity (parallel.pad_to_capacity) 'maybe' is not valid; use on or off" -- -n 1 -- train --pad-to-capacity maybe --steps 1
# plan names a bad layer before it asks for a cost profile.
expect 2 "--shared-overlap on (parallel.shared_overlap) needs shared experts" -- -n 1 -- plan --shared-overlap on
expect 2 "--shared-experts (model.shared_experts) 1 with --device cuda" -- -n 4 -- train --shared-experts 1 --shared-hidden 64 --device cuda --steps 1
expect 2 "--shared-experts (model.shared_experts) 1 with --device cuda --precision bf16" -- -n 1 -- bench-layer --shared-experts 1 --device cuda --precision bf16
expect 2 "--expert-mlp (model.expert_mlp) swiglu with --device cuda" -- -n 1 -- bench-layer --expert-mlp swiglu --device cuda --precision bf16
expect 2 "unknown group 'tp'" -- -n 2 -- bench-comm --groups tp
# Pipeline stages and the order (docs/layout.md).
expect 2 "world size 4 is not divisible by --pp 3" -- -n 4 -- info --pp 3
expect 2 "stage size 2 (world size 4 / --pp 2) is not divisible by --mp 4" -- -n 4 -- info --pp 2 --mp 4
expect 2 "--order 'tp-dp-ep': unknown name 'tp'" -- -n 4 -- info --mp 2 --ep 2 --order tp-dp-ep
expect 2 "valid orders for this layout: dp-ep-mp, dp-mp-ep, ep-dp-mp, ep-mp-dp, mp-dp-ep, mp-ep-dp" -- -n 4 -- info --mp 2 --ep 2 --order mp-dp
expect 2 "names 'ep' twice" -- -n 4 -- info --ep 2 --order ep-dp-ep
expect 2 "different pipeline stages" -- -n 8 -- info --mp 2 --ep 2 --pp 2 --order mp-pp-ep-dp
expect 2 "with the ESP groups the MP groups, got --mp 2 --esp 2 --order mp-ep-esp-dp-pp" -- -n 8 -- check-layer --mp 2 --ep 2 --esp 2 --order mp-ep-esp-dp --schedule baseline
expect 2 "check-layer runs one MoE layer on every rank, inside one pipeline stage: --pp 2" -- -n 2 -- check-layer --pp 2
expect 2 "bench-layer runs one MoE layer on every rank, inside one pipeline stage: --pp 2" -- -n 2 -- bench-layer --pp 2
expect 2 "--pp-split (parallel.pp_split) '2,1' sums to 3 blocks, not the model's 4" -- -n 2 -- train --pp 2 --pp-split 2,1 --steps 1
expect 2 "'2,2' names 2 stages but --pp is 4" -- -n 4 -- train --pp 4 --pp-split 2,2 --steps 1
expect 2 "--pp 8 exceeds the model's 4 blocks" -- -n 8 -- train --pp 8 --steps 1
expect 2 "top-k must be in [1, E = 8], got k = 9" -- -n 1 -- check-layer --topk 9 --experts 8
expect 2 "The following argument was not expected: --bogus" -- -n 1 -- info --bogus
expect 2 "-n needs a positive rank count" -- -n 0 -- info
# A good run passes.
expect 0 "PASS" -- -n 2 -- check-layer --ep 2 --tokens 32 --model-dim 8 --hidden 16 --experts 4
expect 0 "order:  mp-dp-ep-esp-pp" -- -n 4 -- info --mp 2 --ep 2 --order mp-dp-ep

finish
