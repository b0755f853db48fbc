# Shared by the CLI tests that build an emulated cluster (scripts/cluster): defines skip and
# fail, and exits 77 (skip) where namespaces cannot be made (not root, or `unshare --net`
# fails), 1 where $PARM is not a program.
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
unshare --net --uts --mount -- true 2>/dev/null ||
  skip "creating namespaces is not permitted here (unshare --net --uts --mount failed)"
[ -x "$PARM" ] || fail "no parm binary at $PARM"
