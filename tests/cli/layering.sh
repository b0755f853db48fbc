#!/usr/bin/env bash
# The library's layers point down only, and the build keeps it: every folder of src/ is a
# target of its own that sees only the headers of the layers it links (CMakeLists.txt,
# parm_layer). This builds the probes of tests/layering/: each `up` probe, a source of one
# layer that includes a header of a layer above or beside it, must fail to compile on that
# include; each `down` probe must compile.
#   bash layering.sh <path to parm> <source dir>
source "$(dirname "$0")/lib/checks.bash" "$@"

build="$(dirname "$parm")"
probes="$build/layer_probes.txt"
check "the build lists its layer probes" 0 "$([ -s "$probes" ] && echo 0 || echo 1)" "" \
  "missing: $probes"

while read -r kind target layer header; do
  [ -n "$kind" ] || continue
  out="$(cmake --build "$build" --target "$target" 2>&1)"
  rc=$?
  if [ "$kind" = up ]; then
    check "$layer cannot include $header" 1 "$([ $rc -ne 0 ] && echo 1 || echo 0)" \
      "$header: No such file or directory" "$out"
  else
    check "$layer includes $header" 0 "$rc" "" "$out"
  fi
done <"$probes"

finish
