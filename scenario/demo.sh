#!/usr/bin/env bash
# The bundled scenario: a two-socket host (one NUMA node per socket) with a GPU passed through
# with VFIO on node 1, and a pod admitted by the Topology Manager onto node 1. Then the in-place
# updates that never pass the scheduler or the Topology Manager again, and what kata-topo says.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${KATA_TOPO:-$here/../target/debug/kata-topo}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
host=(--topology "$here/two-node-host.xml" --sysfs "$here/sysfs")

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() {
  printf '$ kata-topo %s\n' "$*"
  local rc=0
  "$bin" "$@" || rc=$?
  printf '(exit %s)\n' "$rc"
}

step "The host: two NUMA nodes; GPU 0000:b7:00.0 (VFIO group 42) is local to node 1"
run topology "${host[@]}"

step "Admission: the pod's container 'trainer' gets CPU 1, memory node 1 and the GPU (single-numa-node)"
run check --spec "$here/trainer.json" "${host[@]}" --record-baseline "$work/baseline.json"
echo "baseline recorded:"; cat "$work/baseline.json"

step "In-place resize (KEP-1287): more CPU quota and memory, same cpuset - allowed, no finding"
run check --spec "$here/trainer.json" --update "$here/resize.json" --baseline "$work/baseline.json" "${host[@]}"

step "CPU-manager cpuset push onto node 0: the GPU's DMA now crosses the socket interconnect"
run check --spec "$here/trainer.json" --update "$here/cpuset-push.json" --baseline "$work/baseline.json" "${host[@]}"

step "The same push as JSON (what the event and the log carry)"
run check --spec "$here/trainer.json" --update "$here/cpuset-push.json" --baseline "$work/baseline.json" "${host[@]}" --json

step "The same push in enforce mode: refused"
run check --spec "$here/trainer.json" --update "$here/cpuset-push.json" --baseline "$work/baseline.json" "${host[@]}" --mode enforce

step "A resize beyond node 1's memory"
run check --spec "$here/trainer.json" --update "$here/resize-too-big.json" --baseline "$work/baseline.json" "${host[@]}"

step "The container recreated in its running pod (image update) with a wider cpuset"
run check --spec "$here/trainer-recreated.json" --baseline "$work/baseline.json" "${host[@]}"
