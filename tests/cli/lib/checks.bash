# Shared by the CLI test scripts, which are run as `bash <script> <path to parm> <source dir>`
# and start with `source "$(dirname "$0")/lib/checks.bash" "$@"`. Sets $parm, $src, a
# temporary folder $tmp (removed at exit), exports PARM_BIN, and defines:
#   check <name> <want rc> <got rc> <text the output must contain> <output>
#   ok <name> / bad <name>     the result of a check the script decided itself (tallied)
#   abort <message>            a step that every later check needs failed: FAIL, exit 1
#   prun <parmrun args>        scripts/parmrun with a time limit, stderr into stdout
#   finish                     prints the tally; the script's exit status is its result
# Every check runs (a failed one is counted, not fatal), so one run reports every failure.
set -uo pipefail
parm="$1"
src="$2"
export PARM_BIN="$parm"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
run=0

check() {
  run=$((run + 1))
  if [ "$3" != "$2" ] || ! grep -qF -- "$4" <<<"$5"; then
    echo "FAIL: $1 -> rc $3 (want $2), output must contain: $4"
    echo "$5" | tail -20 | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok:   $1"
  fi
}

ok() {
  run=$((run + 1))
  echo "ok:   $*"
}

bad() {
  run=$((run + 1))
  fails=$((fails + 1))
  echo "FAIL: $*"
}

abort() {
  echo "FAIL: $*" >&2
  exit 1
}

prun() { "$src/scripts/parmrun" --job-timeout 300 "$@" 2>&1; }

finish() {
  echo "$((run - fails)) passed, $fails failed"
  [ "$fails" -eq 0 ]
}
