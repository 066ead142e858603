#!/usr/bin/env bash
# Shared by the guests of make vm-test and make k8s-test (sourced by their guest.sh): the
# guest's paths, the console lines, PID 1's hand-over, the results file, the wrapper's log,
# the cgroup and VFIO set-up, and the leftovers check. The sourcing script sets STEPS first.
# make kata-test's guest and its host-side steps (integration/kata-test/) source it too; the
# steps, on the host, set the paths to the host's after sourcing.
# shellcheck disable=SC2154,SC2034 # STEPS is the sourcing script's; these are its to use
set -euo pipefail

# The guest's paths: the workspace and the results (9p shares), the binaries under test, and
# the node's containerd, wrapper log, state and metrics at their standard places.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ws=/kata-topo
results=/vm-test-results
run=/run/kata-topo-vm
bin=${ws}/target/debug
sock=/run/containerd/containerd.sock
log=/var/log/kata-topo.log
state=/run/kata-topo
metrics=/var/lib/prometheus/node-exporter
export KT_CRI_DIR=${run}/cri

say() { echo "guest: [$(cut -d ' ' -f 1 /proc/uptime) s] $*"; }

# --- PID 1: run the scenario as a child, keep the logs, power off ------------------------------
if [ "$$" = 1 ]; then
  rc=0
  bash "$0" --scenario || rc=$?
  say "scenario exited ${rc}"
  cp "${log}" "${results}/kata-topo.log" 2> /dev/null || true
  dmesg > "${results}/dmesg.txt" 2> /dev/null || true
  echo "${rc}" > "${results}/finished"
  sync
  busybox poweroff -f || echo o > /proc/sysrq-trigger
  sleep 30
  exit 1
fi

# --- results ----------------------------------------------------------------------------------
# A step's seconds count from step_t0 when its runner set it (k8s-test's stories), else from
# the previous record. Steps go to steps.jsonl, or to steps_out when a caller sets it (a
# k8s-test run on a held cluster keeps each run's steps apart).
record_t=$(date +%s)
step_t0=""
record() { # NAME PASS(true|false) RULES DETAIL
  local now seconds
  now=$(date +%s)
  seconds=$((now - ${step_t0:-${record_t}}))
  record_t=${now} step_t0=""
  jq -cn --arg name "$1" --argjson pass "$2" --arg rules "$3" --arg detail "$4" --argjson seconds "${seconds}" \
    '{name: $name, pass: $pass, rules: ($rules | split(" ") | map(select(. != ""))), seconds: $seconds, detail: $detail}' \
    >> "${steps_out:-${results}/steps.jsonl}"
  say "$([ "$2" = true ] && echo pass || echo FAIL) $1 [$3] ${seconds} s"
}

# Every step not recorded yet fails with REASON.
fail_rest() { # REASON
  local name
  for name in "${STEPS[@]}"; do
    if ! grep -qF "\"name\":\"${name}\"" "${steps_out:-${results}/steps.jsonl}" 2> /dev/null; then
      record "${name}" false "" "$1"
    fi
  done
}

# --- the wrapper's log -------------------------------------------------------------------------
log_mark() { wc -l 2> /dev/null < "${log}" || echo 0; }

# The rule ids (sorted, unique, space separated) of the findings logged after line MARK that
# match the jq condition FILTER.
rules_since() { # MARK FILTER
  tail -n "+$(($1 + 1))" "${log}" 2> /dev/null \
    | jq -R -r "fromjson? | select(.event == \"finding\") | select($2) | .rule" \
    | sort -u | paste -sd ' ' -
}

cri() { timeout 120 "${bin}/kata-topo-cri" --endpoint "${sock}" "$@"; }

# --- setup -------------------------------------------------------------------------------------
setup_error=""

setup_mounts() {
  mount -t cgroup2 cgroup2 /sys/fs/cgroup || return 1
  echo "+cpuset +cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control || return 1
  mkdir -p /dev/pts /dev/shm "${run}/bin" "${KT_CRI_DIR}" "${metrics}" /var/lib/containerd
  mount -t devpts devpts /dev/pts || return 1
  mount -t tmpfs shm /dev/shm || return 1
  hostname kata-topo-vm
}

nic=""
group=""
# The e1000e on the expander bus: bound to its driver at boot, rebound to vfio-pci.
setup_vfio() {
  local d
  for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "${d}/vendor")" = 0x8086 ] && [ "$(cat "${d}/device")" = 0x10d3 ]; then
      nic=${d##*/}
    fi
  done
  [ -n "${nic}" ] || { setup_error="no e1000e (8086:10d3) on the PCI bus"; return 1; }
  d=/sys/bus/pci/devices/${nic}
  local before
  before=$(basename "$(readlink "${d}/driver")" 2> /dev/null || echo none)
  [ "${before}" = e1000e ] || { setup_error="${nic} is bound to ${before}, not e1000e"; return 1; }
  echo vfio-pci > "${d}/driver_override" || { setup_error="cannot set ${nic}'s driver_override"; return 1; }
  echo "${nic}" > "${d}/driver/unbind" || { setup_error="cannot unbind ${nic} from ${before}"; return 1; }
  echo "${nic}" > /sys/bus/pci/drivers_probe || { setup_error="drivers_probe ${nic} failed"; return 1; }
  local after
  after=$(basename "$(readlink "${d}/driver")" 2> /dev/null || echo none)
  [ "${after}" = vfio-pci ] || { setup_error="${nic} did not bind to vfio-pci (driver ${after})"; return 1; }
  group=$(basename "$(readlink "${d}/iommu_group")")
  for _ in $(seq 1 50); do
    [ -c "/dev/vfio/${group}" ] && break
    sleep 0.1
  done
  [ -c "/dev/vfio/${group}" ] || { setup_error="/dev/vfio/${group} did not appear"; return 1; }
  jq -n --arg bus_id "${nic}" --arg group "${group}" --arg driver "${after}" \
    --arg previous "${before}" --arg numa "$(cat "${d}/numa_node")" \
    --arg iommu "$(find "/sys/kernel/iommu_groups/${group}/devices" -mindepth 1 -printf '%f\n' | sort | paste -sd ' ' -)" \
    '{bus_id: $bus_id, vfio_group: $group, driver: $driver, previous_driver: $previous,
      numa_node: ($numa | tonumber), iommu_group_devices: ($iommu | split(" "))}' \
    > "${results}/vfio.json"
  say "${nic} (numa_node $(cat "${d}/numa_node")): ${before} -> ${after}, /dev/vfio/${group}"
}

# --- processes ---------------------------------------------------------------------------------
# Ends a child: TERM, KILL after ten seconds, reaped.
stop_pid() { # PID
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2> /dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
}

# --- nothing left ----------------------------------------------------------------------
leftovers() {
  local p argv0 stat
  # Builtins only: a fork per process would make each poll take seconds under TCG.
  for p in /proc/[0-9]*; do
    argv0="" stat=""
    read -r -d '' argv0 < "${p}/cmdline" 2> /dev/null || true
    read -r stat < "${p}/stat" 2> /dev/null || true
    case "${argv0}" in
      *containerd-shim*) [[ "${stat##*) }" == Z* ]] || echo "process ${p##*/}: ${argv0}" ;;
    esac
  done
  find /run/containerd/s -mindepth 1 2> /dev/null | sed 's/^/socket /'
  # The node-wide topology cache (topology-<key>.xml) is the node's, not a pod's: it stays.
  find "${state}" -mindepth 1 -maxdepth 1 ! -name 'topology-*.xml' 2> /dev/null | sed 's/^/state /'
  find "${metrics}" -name 'kata-topo-*' 2> /dev/null | sed 's/^/metrics /'
}

