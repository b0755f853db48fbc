#!/usr/bin/env bash
# --recompute (issue 39; docs/memory.md) on a small BERT MoE model: train_recompute.sh's (a)
# and (b) (lib/recompute_runs.bash), apart so that each script stays short.
#   bash train_recompute_bert.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"
work="$tmp"
source "$(dirname "$0")/lib/recompute_runs.bash"
recompute_runs bert
finish
