# Shared by train_sharding.sh and train_sharding_np8.sh: sources checks.bash and defines
#   train <ranks> <config> <args...>   $steps (default 30) steps of s2, validation at the end
#                                      and every $steps/2
#   pair <ranks> <name> <config> <args...>   the run without and with --optimizer-sharding dp
#       (metrics $tmp/<name>.<none|dp>.jsonl, checkpoints $tmp/<name>.ck-<none|dp>), then
#       checks them bit-identical: metrics and the final checkpoint's tensor files
#   same <a.jsonl> <b.jsonl> [first step]     lib/same_run.py
#   compare <a.jsonl> <b.jsonl> <tol> [...]   lib/compare_losses.py
#   same_files <checkpoint a> <checkpoint b>  every tensor file byte for byte
source "$(dirname "${BASH_SOURCE[0]}")/checks.bash" "$@"
steps=30

train() {
  prun -n "$1" -- train --config "$2" --schedule s2 --steps $steps --eval-every $((steps / 2)) \
                        --log-every $((steps / 2)) "${@:3}"
}
same() { python3 "$src/tests/cli/lib/same_run.py" "$@" 2>&1; }
compare() { python3 "$src/tests/cli/lib/compare_losses.py" "$@" 2>&1; }
same_files() {
  local n=0 f
  for f in "$1"/tensors/*.bin; do
    cmp -s "$f" "$2/tensors/$(basename "$f")" || { echo "tensors/$(basename "$f") differs"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no tensor files in $1"; return 1; }
  echo "$n tensor files (parameters, adam_m, adam_v) identical"
}

pair() {
  local n="$1" name="$2" cfg="$3" sh out
  shift 3
  for sh in none dp; do
    out=$(train "$n" "$cfg" "$@" --optimizer-sharding $sh --metrics "$tmp/$name.$sh.jsonl" \
                --save-dir "$tmp/$name.ck-$sh")
    check "(a) $name np$n $* --optimizer-sharding $sh trains" 0 $? "summary" "$out"
  done
  out=$(same "$tmp/$name.dp.jsonl" "$tmp/$name.none.jsonl")
  check "(a) $name np$n: sharded = unsharded ($out)" 0 $? "bit-identical" "$out"
  local last
  last=$(printf "step-%08d" $steps)
  out=$(same_files "$tmp/$name.ck-dp/$last" "$tmp/$name.ck-none/$last")
  check "(a) $name np$n: parameters and moments after $steps steps ($out)" 0 $? "identical" "$out"
}
