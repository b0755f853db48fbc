# Shared by the CLI test scripts, which are run as `bash <script> <path to parm> <source dir>`
# and start with `source "$(dirname "$0")/lib/checks.bash" "$@"`. Sets $parm, $src, a
# temporary folder $tmp (removed at exit), exports PARM_BIN, and defines:
#   check <name> <want rc> <got rc> <text the output must contain> <output>
#   prun <parmrun args>        scripts/parmrun with a time limit, stderr into stdout
#   finish                     prints the tally; the script's exit status is its result
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

prun() { "$src/scripts/parmrun" --job-timeout 300 "$@" 2>&1; }

finish() {
  echo "$((run - fails)) passed, $fails failed"
  [ "$fails" -eq 0 ]
}
