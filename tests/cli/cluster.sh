#!/usr/bin/env bash
# parm across an emulated 2-node cluster (scripts/cluster, docs/cluster.md): 2 nodes x 2
# ranks joined by a shaped link. Checks that `parm info` finds the nodes by shared memory
# and marks ep inter-node and mp/esp intra-node, and that `parm check-layer` matches the
# oracle with every schedule when ep crosses the network.
#
#   bash tests/cli/cluster.sh <path-to-parm> <source-dir>
#
# Exit 77 (skip) only where namespaces cannot be made: not root, or `unshare --net` fails.
source "$(dirname "$0")/lib/checks.bash" "$@"
CLUSTER=$src/scripts/cluster
LAYOUT=(--mp 2 --ep 2 --esp 2)
RUN_TIMEOUT_S=300

# What `parm info` must say, one row per group: "<group> <intra|inter>". The group's summary
# line is the one whose first word is the group name; it must contain the mark and not the
# opposite one. If the info format changes, adapt info_group_line below (one place).
INFO_EXPECT=(
  "ep inter"
  "mp intra"
  "esp intra"
)
# ...and it must have found 2 nodes on its own (no --ranks-per-node is passed).
INFO_NODES='2 nodes'

# shellcheck source=lib/cluster_prereq.bash
source "$(dirname "$0")/lib/cluster_prereq.bash"

# A state dir of our own, so a user's cluster is never touched; named after the binary, so
# a run that was killed outright (ctest's timeout) is cleaned up by the next one.
PARM_CLUSTER_DIR=/tmp/parm-cluster-test.$(realpath "$parm" | md5sum | cut -c1-10)
export PARM_CLUSTER_DIR
"$CLUSTER" down >/dev/null || abort "cluster down (of a previous run) failed in $PARM_CLUSTER_DIR"
trap '"$CLUSTER" down >/dev/null 2>&1 || echo "WARNING: cluster down failed in $PARM_CLUSTER_DIR" >&2; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

"$CLUSTER" up --nodes 2 --ranks-per-node 2 --inter-gbit 1 --inter-latency-us 50 ||
  abort "cluster up failed"

# The cluster itself, independent of parm: 4 ranks, 2 per hostname.
out=$(PARM_BIN=hostname "$CLUSTER" run --timeout 60 --); rc=$?
check "mpirun of hostname across the nodes" 0 $rc "" "$out"
hosts=$(sort <<<"$out" | uniq -c | awk '{print $1}' | tr '\n' ' ')
if [ "$hosts" = "2 2 " ]; then
  ok "ranks per node: $(sort <<<"$out" | uniq -c | tr -s ' ' | tr '\n' ';')"
else
  bad "expected 2 ranks on each of 2 hostnames, got:"$'\n'"$out"
fi

# The summary line of one group in `parm info` output.
info_group_line() {  # info_group_line <output> <group>
  awk -v g="$2" '$1 == g' <<<"$1" | head -n 1
}

out=$("$CLUSTER" run --timeout "$RUN_TIMEOUT_S" -- info "${LAYOUT[@]}" 2>&1); rc=$?
echo "$out"
check "parm info runs and reports '$INFO_NODES'" 0 $rc "$INFO_NODES" "$out"
for row in "${INFO_EXPECT[@]}"; do
  read -r group mark <<<"$row"
  other=$([ "$mark" = intra ] && echo inter || echo intra)
  line=$(info_group_line "$out" "$group")
  if [ -z "$line" ]; then
    bad "parm info has no line for group $group"
  elif [[ $line == *"$mark"* && $line != *"$other"* ]]; then
    ok "$group is $mark-node"
  else
    bad "group $group should be $mark-node: '$line'"
  fi
done

# Every schedule against the single-process oracle, with ep over the shaped link.
for schedule in baseline s1 s2; do
  out=$("$CLUSTER" run --timeout "$RUN_TIMEOUT_S" -- check-layer "${LAYOUT[@]}" \
      --tokens 64 --model-dim 16 --hidden 32 --experts 4 --topk 2 --capacity-factor 2.0 \
      --schedule "$schedule" 2>&1); rc=$?
  check "check-layer --schedule $schedule across 2 nodes matches the oracle" 0 $rc "" "$out"
done
finish
