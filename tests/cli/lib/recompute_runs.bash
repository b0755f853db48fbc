# The runs of tests/cli/train_recompute*.sh (sourced after lib/checks.bash; $work set): a
# 4-block GPT-2 or BERT MoE model (dense, MoE, dense, MoE) trained 30 steps under each
# --recompute mode, compared with --recompute none bit for bit (a), and the activation
# savings measured against what each mode promises (b, dp 2 only).
# Oversubscribed ranks (8 on 2 cores) sleep while they wait, instead of yielding.
export PARM_WAIT_SLEEP_US=100

# recompute_runs <gpt2|bert>: the runs of one model under the three layouts. 4 blocks:
# dense, MoE, dense, MoE (2 per pipeline stage under pp 2).
recompute_runs() {
local arch="$1"
cat >"$work/$arch.json" <<JSON
{
  "name": "test-recompute-$arch",
  "model": {"arch": "$arch", "seq_len": 32, "model_dim": 64, "num_heads": 4, "num_layers": 4,
            "ffn_hidden": 128, "moe_every": 2, "experts": 4, "expert_hidden": 64, "topk": 2,
            "capacity_factor": "1.25", "seed": 5},
  "optim": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 2},
  "train": {"steps": 30, "micro_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 10},
  "parallel": {"mp": 1, "ep": 1, "esp": 1, "schedule": "s2"}
}
JSON

train() {  # train <arch> <ranks> <name> <parm train args...>
  local arch="$1" n="$2" name="$3"
  shift 3
  rm -rf "$work/$name"
  "$src/scripts/parmrun" -n "$n" --job-timeout 300 -- train --config "$work/$arch.json" \
    --metrics "$work/$name.jsonl" --save-dir "$work/$name" "$@" >"$work/$name.log" 2>&1
}

# same_params <a> <b>: every tensor file (parameters and AdamW moments) of the two final
# checkpoints is byte-identical.
same_params() {
  local a b f n=0
  a=$(ls -d "$work/$1"/step-* | tail -1)
  b=$(ls -d "$work/$2"/step-* | tail -1)
  for f in "$a"/tensors/*; do
    cmp -s "$f" "$b/tensors/$(basename "$f")" || { echo "$(basename "$f") differs"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] && echo "$n tensor files (parameters, moments) byte-identical"
}

# acts <name>: the activations' peak bytes (max over ranks) of the run's last step.
acts() { python3 -c 'import json,sys; print(int(json.loads(open(sys.argv[1]).readlines()[-1])["mem_peak_bytes"]["activations"]))' "$work/$1.jsonl"; }

  # (a) bit-identity, and (b) the savings, per layout. One schedule per layout, so that every
  # schedule's buffers meet each mode: S2 (the config's), S1 with the fused collectives (its
  # l_aux statistics summed in place by a collective), the baseline.
  for layout in "dp2:2 --mp 1 --ep 2" "dp2mp2:8 --mp 2 --ep 2 --esp 2 --schedule s1 --fuse on" \
                "pp2:4 --pp 2 --mp 1 --ep 2 --grad-accum 2 --schedule baseline"; do
    tag="${layout%%:*}"
    set -- ${layout#*:}
    n=$1
    shift
    ref="$arch-$tag-none"
    train "$arch" "$n" "$ref" "$@" --recompute none || { bad "(a) $ref: run failed"; tail -5 "$work/$ref.log"; continue; }
    for mode in moe-act moe block; do
      name="$arch-$tag-$mode"
      if ! train "$arch" "$n" "$name" "$@" --recompute $mode; then
        bad "(a) $name: run failed"; tail -5 "$work/$name.log"; continue
      fi
      if out=$(python3 "$src/tests/cli/lib/same_run.py" "$work/$name.jsonl" "$work/$ref.jsonl") &&
         out2=$(same_params "$name" "$ref"); then
        ok "(a) $name = none: $out; $out2"
      else
        bad "(a) $name differs from none: $out ${out2:-}"
      fi
    done
    [ "$tag" = dp2 ] || continue
    # (b) dp 2, mp 1, ep 2, esp 1, one activation slot. T = 4 x 32 = 128 tokens, M 64,
    # Ml 64, 4 heads, F 128, L 32, E 4 (2 local), H 64, k 2, f 1.25: C = ceil(2 x 1.25 x 128
    # / 4) = 80 slots, each local expert 2 x 80 rows (one block per EP peer).
    # moe-act keeps one set of the experts' rows (input M, x W1 H, GeLU H) for the two MoE
    # layers instead of two: it saves one layer's, 4 x 2 x 160 x (64 + 2 x 64) bytes.
    # block keeps one set of block activations for the 4 blocks: it saves the two MoE blocks'
    # sets and one dense block's. A set: ln1, ln2, res_mid (T, M), 4 statistics (T), qkv
    # (3, T, Ml), probs (B, heads, L, L), att (T, Ml); a dense block's adds fc_pre, fc_act
    # (T, F).
    # moe also keeps one set of the step buffers only compute steps write and of every
    # buffer's gradient. S2 at mp 1, ep 2, esp 1 has the buffers x (T, M), the statistics
    # (2E, allocated 2E + 1), dispatch (E, C, M), ep_recv and expert_out (2, 2, C, M), ep_back
    # (E, C, M) and out (T, M); the collectives write ep_recv and ep_back, the layer's copy x.
    # Pooled per layer: the values of stats, dispatch, expert_out, out and all 7 gradients,
    # in floats: values 9 + 20480 + 20480 + 8192, gradients 8192 + 9 + 4 x 20480 + 8192 floats; each
    # layer adds a replay scratch of 2E + 1 floats.
    none=$(acts "$ref")
    set_moe=$((4 * (3 * 128 * 64 + 4 * 128 + 3 * 128 * 64 + 4 * 4 * 32 * 32 + 128 * 64)))
    set_dense=$((set_moe + 4 * 2 * 128 * 128))
    rows=$((4 * 2 * 160 * (64 + 2 * 64)))
    pooled=$((4 * ((9 + 20480 + 20480 + 8192) + (8192 + 9 + 4 * 20480 + 8192))))
    for mode in moe-act moe block; do
      want=$rows
      [ $mode = moe ] && want=$((rows + pooled - 2 * 4 * 9))
      [ $mode = block ] && want=$((2 * set_moe + set_dense))
      got=$((none - $(acts "$arch-$tag-$mode")))
      if [ "$got" -eq "$want" ]; then
        ok "(b) $arch $mode saves $got activation bytes of $none, as promised"
      else
        bad "(b) $arch $mode saves $got activation bytes of $none, promised $want"
      fi
    done
  done
}
