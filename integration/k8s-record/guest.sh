#!/usr/bin/env bash
# The k8s-record guest (integration/vm-test/run.sh k8s-record, make k8s-record): the node of
# make k8s-test, its kubelet restarted under every Topology Manager policy (none, best-effort,
# restricted, single-numa-node) and scope (container, pod), with the static CPU manager and the
# Static memory manager throughout. Under each, one Guaranteed pod at a time (the node has one
# allocatable CPU): `dev` with the VFIO NIC of kata-topo's device plugin, `plain` without, each
# beside a Burstable pod of the shared pool. What the kubelet's PodResources API answers (List,
# by the kubelet's own client) is kept as recordings/POLICY-SCOPE-dev.json and -plain.json,
# with the kubelet's configuration of the run and the guest's hwloc topology; make k8s-record
# copies them into core/tests/fixtures/pod-resources/, where core/tests/kubelet_recordings.rs
# reads them back. A step is a policy and scope: it passes when both pods were admitted and
# both answers recorded.
#
#   guest.sh --list-steps   the step names, one a line
set -euo pipefail

policies=(none best-effort restricted single-numa-node)
scopes=(container pod)
if [ "${1:-}" = --list-steps ]; then
  for p in "${policies[@]}"; do
    for s in "${scopes[@]}"; do echo "record-${p}-${s}"; done
  done
  exit 0
fi

# The node's set-up of make k8s-test (containerd, the wrapper, the kubelet, the device plugin).
# shellcheck source=integration/k8s-test/guest.sh
. /kata-topo/integration/k8s-test/guest.sh --functions
STEPS=()
for p in "${policies[@]}"; do
  for s in "${scopes[@]}"; do STEPS+=("record-${p}-${s}"); done
done
recordings=${results}/recordings

# A Guaranteed pod NAME with one exclusive CPU and 256 MiB, and the VFIO NIC when DEVICE is yes.
guaranteed_pod() { # NAME DEVICE
  local extra=""
  if [ "$2" = yes ]; then extra=', kata-topo.io/vfio: "1"'; fi
  k apply -f - > /dev/null << EOF2
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeName: ${node}
  runtimeClassName: kata-topo
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: localhost/kata-topo/busybox:1
      imagePullPolicy: Never
      command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
      resources:
        requests: {cpu: "1", memory: 256Mi${extra}}
        limits: {cpu: "1", memory: 256Mi${extra}}
EOF2
}

# The kubelet stopped, its CPU and memory managers' checkpoints gone (they name the policy they
# were made under), its configuration at POLICY and SCOPE, started again; ready once the device
# plugin registered with it again.
restart_kubelet_with() { # POLICY SCOPE
  kill -TERM "${kubelet_pid}" 2> /dev/null || true
  wait "${kubelet_pid}" 2> /dev/null || true
  rm -f "${kubelet_root}/cpu_manager_state" "${kubelet_root}/memory_manager_state"
  sed -i -e "s/^topologyManagerPolicy: .*/topologyManagerPolicy: $1/" \
    -e "s/^topologyManagerScope: .*/topologyManagerScope: $2/" "${kubelet_root}/config.yaml"
  start_kubelet
  poll 180 allocatable_has_device
}
allocatable_has_device() { "${k8s}/podresources" --allocatable 2> /dev/null | grep -q 'kata-topo.io/vfio'; }

# Pod NAME admitted and running; the kubelet's List answer kept as FILE.
record_pod() { # NAME DEVICE FILE
  guaranteed_pod "$1" "$2" || return 1
  poll 180 ready "$1" || return 1
  "${k8s}/podresources" > "$3" 2> "${run}/podresources.err" || return 1
  k delete pod "$1" --wait=true --timeout=120s > /dev/null 2>&1 || return 1
  # Its CPU back in the shared pool before the next pod is admitted.
  sleep 2
}

step_record() { # POLICY SCOPE
  local name="record-$1-$2" base="${recordings}/$1-$2" why=""
  k delete pods --all --wait=true --timeout=120s > /dev/null 2>&1 || true
  if ! restart_kubelet_with "$1" "$2"; then
    record "${name}" false "" "the kubelet under $1/$2 never listed the device plugin's NIC: $(tail -n 2 "${results}/kubelet.log" | cut -c 1-300)"
    return 0
  fi
  cp "${kubelet_root}/config.yaml" "${base}.kubelet-config.yaml"
  pod kt-shared burstable || true
  record_pod kt-dev yes "${base}-dev.json" || why="kt-dev: $(k get pod kt-dev -o jsonpath='{.status.reason} {.status.message}' 2> /dev/null | cut -c 1-200)"
  if [ -z "${why}" ]; then
    record_pod kt-plain no "${base}-plain.json" || why="kt-plain: $(k get pod kt-plain -o jsonpath='{.status.reason} {.status.message}' 2> /dev/null | cut -c 1-200)"
  fi
  local cpus
  cpus=$(jq -c '[.podResources[]? | select(.name == "kt-dev") | .containers[].cpuIds] | first' "${base}-dev.json" 2> /dev/null || echo "?")
  if [ -z "${why}" ]; then
    record "${name}" true "" "topologyManagerPolicy $1, scope $2: kt-dev (CPUs ${cpus}, the NIC) and kt-plain admitted and recorded"
  else
    record "${name}" false "" "topologyManagerPolicy $1, scope $2: ${why}"
  fi
}

record_main() {
  say "kernel $(uname -r), $(nproc) CPUs, NUMA nodes $(cat /sys/devices/system/node/online)"
  mkdir -p "${run}/bin" "${kubelet_root}" "${recordings}"
  if ! setup_mounts; then fail_rest "setup: mounting cgroup2, devpts, shm failed"; return 1; fi
  if ! setup_network; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_vfio; then fail_rest "setup: ${setup_error}"; return 1; fi
  lstopo-no-graphics --of xml > "${recordings}/topology.xml" 2> /dev/null || true
  if ! setup_containerd; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_kubelet; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_device_plugin; then fail_rest "setup: ${setup_error}"; return 1; fi
  cat "${results}/k8s/kubelet.version" > "${recordings}/kubelet.version"
  local p s
  for p in "${policies[@]}"; do
    for s in "${scopes[@]}"; do step_record "${p}" "${s}" || true; done
  done
  k delete pods --all --wait=true --timeout=120s > /dev/null 2>&1 || true
  fail_rest "the step ended without recording a result"
  for p in "${plugin_pid}" "${kubelet_pid}" "${containerd_pid}"; do
    if [ -n "${p}" ]; then kill "${p}" 2> /dev/null || true; fi
  done
  ! grep -q '"pass":false' "${results}/steps.jsonl"
}

case "${1:-}" in
  --scenario) record_main ;;
  *)
    echo "guest.sh runs as PID 1 of the k8s-record guest (make k8s-record); --list-steps lists its steps" >&2
    exit 2
    ;;
esac
