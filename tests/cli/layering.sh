#!/usr/bin/env bash
# The library's layers point down only: a directory of src/ includes nothing from the
# directories above it (below: the shape, then the schedules, then the layer, ...). Reads the
# sources only; the parm binary is not run.
#   bash layering.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

# forbidden <dir> <include prefixes it must not use...>
forbidden() {
  local dir="$1"
  shift
  for above in "$@"; do
    hits="$(grep -rn "#include \"$above/" "$src/src/$dir" 2>/dev/null)"
    check "src/$dir includes nothing from src/$above" 0 "$([ -z "$hits" ] && echo 0 || echo 1)" \
      "" "$hits"
  done
}

forbidden shape moe schedule comm model perfmodel train data kernels
forbidden schedule moe model perfmodel train data
forbidden data moe schedule model perfmodel train
forbidden moe model perfmodel train data
forbidden perfmodel model train data

finish
