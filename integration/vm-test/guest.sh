#!/usr/bin/env bash
# The vm-test guest (integration/vm-test/run.sh boots it): PID 1 of a QEMU guest with two NUMA
# nodes (CPU 0 on node 0, CPU 1 on node 1), a vIOMMU and an e1000e NIC on node 1. It mounts
# cgroup v2, rebinds the NIC from e1000e to vfio-pci (driver_override), starts containerd with
# the kata-topo handler delegating to runc and the wrapper on the live topology (hwloc and the
# real /sys, no topology_xml), and runs the scenario: the guest's `kata-topo topology`, then
# vagrant/test.sh (its local target, with the real /dev/vfio/<group>), then a resize beyond
# node 1's memory, CPU 1 taken offline, and the clean-up. Each step is appended to
# /vm-test-results/steps.jsonl as {name, pass, rules, detail}; the rules are read from the
# wrapper's log, never assumed.
#
#   guest.sh --list-steps   the step names, one a line (the host's report lists them all)
set -euo pipefail

STEPS=(topology admission audit-cpuset-push enforce-cpuset-push vagrant-scenario
  resize-beyond-node cpu-offline-drift cleanup)

if [ "${1:-}" = --list-steps ]; then
  printf '%s\n' "${STEPS[@]}"
  exit 0
fi

# shellcheck source=integration/vm-test/guest-lib.sh
. /kata-topo/integration/vm-test/guest-lib.sh

containerd_pid=""
setup_containerd() {
  ln -sf "${bin}/containerd-shim-kata-topo-v2" "${run}/bin/containerd-shim-kata-topo-v2" || return 1
  # The wrapper on the live machine: no topology_xml, the real /sys. Both files from the
  # templates the integration tests use (integration/templates/).
  local templates=${ws}/integration/templates
  "${templates}/render.sh" "${templates}/topology-guard.toml" \
    DELEGATE=containerd-shim-runc-v2 MODE=audit POLICY=restricted SYSFS=/sys \
    STATE_DIR="${state}" LOG_FILE="${log}" METRICS_DIR="${metrics}" REFRESH_SECONDS=2 \
    > "${run}/kata-topo.toml" || return 1
  # The layout of the integration tests' containerd, at the standard paths of a node.
  "${templates}/render.sh" "${templates}/containerd.toml" V2=1 \
    ROOT=/var/lib/containerd STATE=/run/containerd ADDRESS="${sock}" \
    SANDBOX_IMAGE=localhost/kata-topo/pause:1 CNI="${run}/cni" \
    > "${run}/containerd.toml" || return 1
  PATH="${run}/bin:${PATH}" KATA_TOPO_CONFIG="${run}/kata-topo.toml" \
    containerd --config "${run}/containerd.toml" < /dev/null > "${results}/containerd.log" 2>&1 &
  containerd_pid=$!
  local up=""
  for _ in $(seq 1 300); do
    if ctr -a "${sock}" version > /dev/null 2>&1; then up=1; break; fi
    sleep 0.2
  done
  [ -n "${up}" ] || { setup_error="containerd did not come up: $(tail -n 3 "${results}/containerd.log")"; return 1; }
  local image
  for image in pause busybox; do
    ctr -a "${sock}" -n k8s.io images import "${ws}/target/kata-topo-images/${image}.tar" > /dev/null \
      || { setup_error="ctr images import ${image}.tar failed"; return 1; }
  done
  say "containerd $(containerd --version | awk '{print $3}') up, images imported"
}

# --- step 1: the guest's topology ---------------------------------------------------------------
step_topology() {
  local t=${results}/topology.json
  if ! "${bin}/kata-topo" topology --json > "${t}" 2> "${run}/topology.err"; then
    record topology false "" "kata-topo topology failed: $(cat "${run}/topology.err")"
    return
  fi
  "${bin}/kata-topo" topology > "${results}/topology.txt" 2>&1 || true
  local nodes dev
  nodes=$(jq -r '[.numa_nodes[] | "node \(.os_index): CPUs \(.cpus), \(.memory_bytes / 1048576 | floor) MiB"] | join("; ")' "${t}")
  dev=$(jq -c --arg b "${nic}" '.pci_devices[] | select(.bus_id == $b)' "${t}")
  local source detail
  source=$(jq -r .source "${t}")
  detail="source ${source}, ${nodes}; ${nic}: ${dev:-not listed}"
  if jq -e --arg b "${nic}" --arg g "${group}" '
      (.numa_nodes | length == 2)
      and (.numa_nodes[0].os_index == 0 and .numa_nodes[0].cpus == "0")
      and (.numa_nodes[1].os_index == 1 and .numa_nodes[1].cpus == "1")
      and ([.pci_devices[] | select(.bus_id == $b and .numa_nodes == [1]
            and .vfio_group == $g and .driver == "vfio-pci")] | length == 1)' "${t}" > /dev/null; then
    record topology true "" "${detail}"
  else
    record topology false "" "expected nodes 0 (CPU 0) and 1 (CPU 1) and ${nic} on node 1 in VFIO group ${group}: ${detail}"
  fi
}

# --- steps 2-5: vagrant/test.sh, local target ----------------------------------------------------
# The lines of test.sh's output in the section whose header starts with TITLE.
section() { # TITLE
  awk -v t="== $1" 'index($0, "== ") == 1 { on = (index($0, t) == 1) } on' "${run}/scenario.log"
}

# PASS when the section has every expected line and no FAIL line.
section_check() { # TITLE LINE...
  local title=$1 text missing=""
  shift
  text=$(section "${title}")
  [ -n "${text}" ] || { echo "not reached (test.sh stopped earlier)"; return 1; }
  if grep -q '^FAIL' <<< "${text}"; then
    grep '^FAIL' <<< "${text}" | head -n 1
    return 1
  fi
  local line
  for line in "$@"; do
    grep -qF -- "${line}" <<< "${text}" || missing="${missing}${missing:+; }${line}"
  done
  [ -z "${missing}" ] || { echo "missing: ${missing}"; return 1; }
  grep -E '^(ok|container):' <<< "${text}" | paste -sd ';' - | cut -c 1-600
}

# RULES equal to WANT (both sorted, space separated) and the section passed.
step_from_section() { # NAME TITLE WANT RULES LINE...
  local name=$1 title=$2 want=$3 rules=$4 detail ok=true
  shift 4
  detail=$(section_check "${title}" "$@") || ok=false
  if [ "${rules}" != "${want}" ]; then
    ok=false
    detail="rules [${rules}], expected [${want}]; ${detail}"
  fi
  record "${name}" "${ok}" "${rules}" "${detail}"
}

step_vagrant_scenario() {
  local mark rc=0
  mark=$(log_mark)
  say "running vagrant/test.sh (KT_TARGET=local, /dev/vfio/${group})"
  KT_TARGET=local KT_SOCK=${sock} KT_LOG=${log} KT_STATE=${state} KT_METRICS=${metrics} \
    KT_BIN=${bin} KT_NODE=1 KT_HOME_CPUS=1 KT_AWAY_CPUS=0 KT_VFIO=/dev/vfio/${group} \
    timeout 300 bash "${ws}/vagrant/test.sh" > "${run}/scenario.log" 2>&1 || rc=$?
  cp "${run}/scenario.log" "${results}/scenario.log"
  local audit enforce all
  audit='.pod_name == "kt-audit"'
  enforce='.pod_name == "kt-enforce"'
  step_from_section admission "admission:" "" \
    "$(rules_since "${mark}" "${audit} and (.operation == \"sandbox\" or .operation == \"create\")")" \
    "ok: log: no finding" "ok: kata-topo status exit 0"
  step_from_section audit-cpuset-push "cpuset push across NUMA nodes" "cpu-outside-intent vfio-remote" \
    "$(rules_since "${mark}" "${audit} and .operation == \"update\" and .decision == \"allow\"")" \
    "ok: log: cpu-outside-intent allow" "ok: log: vfio-remote allow" \
    "ok: kata-topo events: /kata-topo/mismatch with cpu-outside-intent" \
    "ok: kata-topo events: /kata-topo/mismatch with vfio-remote" \
    "ok: kata-topo status exit 1" "container: RUNNING 0"
  step_from_section enforce-cpuset-push "enforce mode" "cpu-outside-intent vfio-remote" \
    "$(rules_since "${mark}" "${enforce} and .operation == \"update\" and .decision == \"reject\"")" \
    "ok: refused: FailedPrecondition" "ok: log: cpu-outside-intent reject" \
    "ok: container still running on 1"
  all=$(rules_since "${mark}" "true")
  if [ "${rc}" = 0 ] && grep -q '^== scenario passed' "${run}/scenario.log"; then
    record vagrant-scenario true "${all}" "vagrant/test.sh passed: $(grep -c '^ok:' "${run}/scenario.log") checks (admission, resize, push, recreate, enforce)"
  else
    record vagrant-scenario false "${all}" "vagrant/test.sh exited ${rc}: $(grep -E '^FAIL' "${run}/scenario.log" | head -n 1)$(tail -n 2 "${run}/scenario.log" | paste -sd ' ' -)"
  fi
}

# --- steps 6-7: a pod of our own ------------------------------------------------------------------
pod=""
ctr=""
step_resize_beyond_node() {
  local node1 ask mark rules rc=0 err
  pod=$(cri run-pod kt-resize --annotation kata-topo.io/policy=single-numa-node \
    --annotation kata-topo.io/numa-nodes=1 --annotation kata-topo.io/mode=audit 2> "${run}/err") \
    || { record resize-beyond-node false "" "RunPodSandbox: $(cat "${run}/err")"; return 1; }
  ctr=$(cri start "${pod}" app --cpus 1 --vfio "/dev/vfio/${group}" 2> "${run}/err") \
    || { record resize-beyond-node false "" "StartContainer: $(cat "${run}/err")"; return 1; }
  node1=$(jq '.numa_nodes[] | select(.os_index == 1) | .memory_bytes' "${results}/topology.json")
  ask=$((node1 + (128 << 20)))
  mark=$(log_mark)
  cri update "${ctr}" --cpus 1 --memory "${ask}" 2> "${run}/err" || rc=$?
  err=$(cat "${run}/err")
  rules=$(rules_since "${mark}" '.pod_name == "kt-resize" and .operation == "update"')
  local detail="memory limit ${ask} bytes asked, node 1 has ${node1}; update exit ${rc}${err:+ (${err})}"
  if [ "${rules}" = memory-exceeds-nodes ] && [ "${rc}" = 0 ]; then
    record resize-beyond-node true "${rules}" "${detail}"
  else
    record resize-beyond-node false "${rules}" "expected [memory-exceeds-nodes] and the update allowed (audit): ${detail}"
  fi
}

refreshes() { # the pod's ok topology refreshes so far
  cat "${metrics}"/kata-topo-*.prom 2> /dev/null \
    | sed -n 's/^kata_topo_topology_refreshes_total{.*result="ok"} \([0-9]*\)$/\1/p' | head -n 1
}

step_cpu_offline_drift() {
  local online=/sys/devices/system/cpu/cpu1/online before now="" mark rules rc=0 err
  [ -n "${ctr}" ] || { record cpu-offline-drift false "" "no container from the previous step"; return 1; }
  before=$(refreshes)
  [ -n "${before}" ] || { record cpu-offline-drift false "" "no kata_topo_topology_refreshes_total in ${metrics}"; return 1; }
  echo 0 > "${online}" || { record cpu-offline-drift false "" "cannot take CPU 1 offline"; return 1; }
  # Two refreshes after the change: the first may have started before it.
  for _ in $(seq 1 300); do
    now=$(refreshes)
    [ "${now:-0}" -ge $((before + 2)) ] && break
    sleep 0.2
  done
  mark=$(log_mark)
  cri update "${ctr}" --cpus 1 --memory $((256 << 20)) 2> "${run}/err" || rc=$?
  err=$(cat "${run}/err")
  rules=$(rules_since "${mark}" '.pod_name == "kt-resize" and .operation == "update"')
  echo 1 > "${online}" || true
  local detail back
  back=$(cat "${online}")
  detail="CPU 1 online=0, topology refreshes ${before} -> ${now}; next update exit ${rc}${err:+ (${err})}; CPU 1 back online=${back}"
  if grep -qw topology-drift <<< "${rules}" && [ "${now:-0}" -ge $((before + 2)) ]; then
    record cpu-offline-drift true "${rules}" "${detail}"
  else
    record cpu-offline-drift false "${rules}" "expected topology-drift after the refresh: ${detail}"
  fi
}

# --- step 8: nothing left ---
step_cleanup() {
  local left="" removed=""
  if [ -n "${pod}" ]; then
    cri remove-pod "${pod}" 2> "${run}/err" && removed="pod kt-resize removed" \
      || removed="remove-pod failed: $(cat "${run}/err")"
  fi
  for _ in $(seq 1 150); do
    left=$(leftovers)
    [ -z "${left}" ] && break
    sleep 0.2
  done
  local status rc=0
  status=$("${bin}/kata-topo" status --state-dir "${state}" 2>&1) || rc=$?
  status=$(head -n 1 <<< "${status}")
  if [ -z "${left}" ] && [ "${rc}" = 0 ]; then
    local cached
    cached=$(find "${state}" -mindepth 1 -maxdepth 1 -name 'topology-*.xml' -user 0 -perm 600 2> /dev/null | wc -l)
    record cleanup true "" "${removed:-no pod of ours}; no containerd-shim process, no socket in /run/containerd/s, ${state} and the metrics empty but for ${cached} topology cache file(s); kata-topo status exit ${rc}: ${status}"
  else
    record cleanup false "" "${removed}; kata-topo status exit ${rc}: ${status}; left: $(paste -sd ';' - <<< "${left}" | cut -c 1-600)"
  fi
}

# --- the run -------------------------------------------------------------------------------------
main() {
  say "kernel $(uname -r), $(nproc) CPUs, NUMA nodes $(cat /sys/devices/system/node/online)"
  uname -r -v > "${results}/kernel.txt"
  mkdir -p "${run}"
  if ! setup_mounts; then fail_rest "setup: mounting cgroup2, devpts, shm failed"; return 1; fi
  if ! setup_vfio; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_containerd; then fail_rest "setup: ${setup_error}"; return 1; fi
  # Each step records its result on every path (they run without errexit: `|| true`).
  step_topology || true
  step_vagrant_scenario || true
  step_resize_beyond_node || true
  step_cpu_offline_drift || true
  step_cleanup || true
  fail_rest "the step ended without recording a result"
  kill "${containerd_pid}" 2> /dev/null || true
  wait "${containerd_pid}" 2> /dev/null || true
  ! grep -q '"pass":false' "${results}/steps.jsonl"
}

case "${1:-}" in
  --scenario) main ;;
  *)
    echo "guest.sh runs as PID 1 of the vm-test guest (make vm-test); --list-steps lists its steps" >&2
    exit 2
    ;;
esac
