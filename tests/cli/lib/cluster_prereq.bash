# Shared by the CLI tests that build an emulated cluster (scripts/cluster), sourced after
# checks.bash: defines skip, and exits 77 (skip) where namespaces cannot be made (not root,
# or `unshare --net` fails), 1 where $parm is not a program.
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
unshare --net --uts --mount -- true 2>/dev/null ||
  skip "creating namespaces is not permitted here (unshare --net --uts --mount failed)"
[ -x "$parm" ] || abort "no parm binary at $parm"
