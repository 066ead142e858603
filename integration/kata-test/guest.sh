#!/usr/bin/env bash
# The kata-test guest: PID 1 of the VM that the remote hypervisor service
# (kata-topo-remote-hypervisor) boots for a Kata pod sandbox at StartVM — the vm-test machine
# (two NUMA nodes: CPU 0 on node 0, CPU 1 on node 1; an e1000e on node 1 rebound to vfio-pci).
# It mounts cgroup v2, binds the NIC to vfio-pci, writes its live topology for the wrapper on the
# host (hwloc's XML, and kata-topo's JSON for the report), mounts the sandbox's shared
# directory (the 9p share kataShared) where Kata's agent expects it, starts the real kata-agent
# (not as PID 1) on tcp://10.0.2.15:1024 — the port the service forwards to the agent's socket —
# and serves its control port (1025) until the service asks it to power off.
#
# The scenario's steps run on the host (integration/kata-test/steps.sh), through CRI.
#
#   guest.sh --list-steps   the step names, one a line (the host's report lists them all)
set -euo pipefail

if [ "${1:-}" = --list-steps ]; then
  exec bash "$(dirname "${BASH_SOURCE[0]}")/steps.sh" --list-steps
fi

# guest-lib.sh's record/fail_rest are the host's here; the guest records no step.
STEPS=()
# shellcheck source=integration/vm-test/guest-lib.sh
. /kata-topo/integration/vm-test/guest-lib.sh

agent=${ws}/target/kata/kata-agent
shared=/run/kata-containers/shared/containers
agent_pid=""
agent_rc=0

# The sandbox's shared directory (Kata's `…/sandboxes/<id>/shared` on the host, read-only over
# 9p) under a tmpfs: the containers' root file systems come from the host, and the files Kata
# copies in (CopyFile: /etc/hosts, resolv.conf, … of each container; the remote hypervisor
# shares no file system) land in the tmpfs.
setup_shared() {
  mkdir -p "${run}/kataShared" "${run}/shared-rw" "${shared}" || return 1
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro kataShared "${run}/kataShared" \
    || { setup_error="mounting the 9p share kataShared"; return 1; }
  mount -t tmpfs -o mode=0755 shared-rw "${run}/shared-rw" || return 1
  mkdir -p "${run}/shared-rw/upper" "${run}/shared-rw/work"
  mount -t overlay overlay \
    -o "lowerdir=${run}/kataShared,upperdir=${run}/shared-rw/upper,workdir=${run}/shared-rw/work,xino=off" \
    "${shared}" || { setup_error="the overlay on ${shared}"; return 1; }
}

# The user-mode NIC the service added (virtio-net): the guest is 10.0.2.15, nothing else is
# reachable (QEMU's restrict=on), the host reaches the two forwarded ports.
setup_network() {
  local i dev=""
  for i in /sys/class/net/*; do
    if [ "$(basename "$(readlink "${i}/device/driver" 2> /dev/null)")" = virtio_net ]; then dev=${i##*/}; fi
  done
  [ -n "${dev}" ] || { setup_error="no virtio-net interface for the agent"; return 1; }
  if ! { ip link set lo up && ip link set "${dev}" up && ip addr add 10.0.2.15/24 dev "${dev}"; }; then
    setup_error="cannot configure ${dev}"
    return 1
  fi
}

# The live topology, for the wrapper on the host: hwloc's XML written whole, then renamed.
write_topology() {
  "${bin}/kata-topo" topology --json > "${results}/topology.json" 2> "${run}/topology.err" \
    || { setup_error="kata-topo topology: $(head -c 300 "${run}/topology.err")"; return 1; }
  lstopo-no-graphics --whole-io --of xml > "${results}/topology.xml.tmp" 2> "${run}/lstopo.err" \
    || { setup_error="lstopo: $(head -c 300 "${run}/lstopo.err")"; return 1; }
  mv "${results}/topology.xml.tmp" "${results}/topology.xml"
}

start_agent() {
  cat > "${run}/agent.toml" << 'EOF'
server_addr = "tcp://10.0.2.15:1024"
log_level = "info"
EOF
  "${agent}" --config "${run}/agent.toml" < /dev/null > "${results}/kata-agent.log" 2>&1 &
  agent_pid=$!
  say "kata-agent $("${agent}" --version | awk '{print $3}') started (pid ${agent_pid})"
}

# One connection on the control port: a line `poweroff` is answered `ok` and ends the guest.
serve_control() {
  cat > "${run}/control.sh" << EOF
#!/bin/sh
read -r line
case "\${line}" in
  poweroff) echo ok; : > "${run}/poweroff" ;;
  *) echo "unknown: \${line}" ;;
esac
EOF
  chmod 0755 "${run}/control.sh"
  while [ ! -e "${run}/poweroff" ]; do
    if [ -n "${agent_pid}" ] && ! kill -0 "${agent_pid}" 2> /dev/null; then
      # The agent exits by itself after Kata's DestroySandbox (it is not PID 1): the guest
      # waits for the power-off all the same.
      wait "${agent_pid}" || agent_rc=$?
      say "kata-agent exited ${agent_rc}: $(tail -n 1 "${results}/kata-agent.log" | jq -r '.msg? // .' 2> /dev/null | cut -c 1-200)"
      agent_pid=""
    fi
    # One connection at a time; the NIC reaches nothing but the host's forwarded ports.
    busybox nc -l -p 1025 -e "${run}/control.sh" < /dev/null > "${run}/nc.out" 2>&1 \
      || { say "the control port: $(head -c 200 "${run}/nc.out")"; sleep 1; }
  done
}

main() {
  say "kernel $(uname -r), $(nproc) CPUs, NUMA nodes $(cat /sys/devices/system/node/online)"
  uname -r -v > "${results}/kernel.txt"
  mkdir -p "${run}"
  setup_mounts || { say "FAILED: mounting cgroup2, devpts, shm"; return 1; }
  local step
  for step in setup_network setup_vfio write_topology setup_shared; do
    "${step}" || { say "FAILED: ${step}: ${setup_error}"; return 1; }
  done
  say "topology written; the sandbox's shared directory on ${shared}"
  start_agent
  serve_control
  say "power-off asked"
  stop_pid "${agent_pid}"
  [ "${agent_rc}" = 0 ]
}

case "${1:-}" in
  --scenario) main ;;
  *)
    echo "guest.sh runs as PID 1 of the kata-test guest (the remote hypervisor service boots it); --list-steps lists the steps" >&2
    exit 2
    ;;
esac
