#!/usr/bin/env bash
# k8s-test's second node, kata-topo-b: a real kubelet with its own containerd (Debian's 1.6) and
# kata-topo's wrapper, on this host, in a mount and PID namespace of its own, under the cgroup
# root /kata-topo-b. Its topology is the host's (one NUMA node here), it has no VFIO device and
# no CPU, memory or Topology Manager policy: the node a rolling upgrade's new pod goes to when
# the label the pod requires moved there, and the installer's second node (its DaemonSet's pod
# installs kata-topo here as on node A: /opt of the namespace, the handler in the directory its
# containerd imports, containerd restarted by the node's restart command).
#
# Why on the host and not a second guest: under TCG a second emulated node would share the two
# host cores with node A and double the time of every step on either; here the kubelet and
# containerd run natively, and the namespaces keep the host's own paths untouched. The node sees
# the same paths as node A (/var/lib/kubelet, /run/containerd, the wrapper's configuration under
# /run/kata-topo-vm), so a manifest written for one fits the other.
#
#   node-b.sh run      PID 1 of its namespaces (host.sh: unshare --mount --pid --fork): mounts,
#                      containerd, the images; the kubelet once the guest asks for it
#                      (SHARE/start appears: the story node-b, before the installer's);
#                      answers the guest's questions (SHARE/ask-WHAT); stays until killed
#   node-b.sh clean    on the host, once the namespace has ended: the cgroups, the bridge, the
#                      node's address, the kernel settings the kubelet changed, the data; prints
#                      what it could not remove
#
# Environment (host.sh sets it): NODE_B_DIR (its data, removed by clean), NODE_B_SHARE (what the
# guest reads: logs, the wrapper's state; the guest's request files), KT_K8S_BIN, WORKSPACE,
# NODE_B_KUBECONFIG.
set -euo pipefail

dir=${NODE_B_DIR:?}
share=${NODE_B_SHARE:?}
node=kata-topo-b
cgroup_root=kata-topo-b
bridge=kt-cni1
pod_cidr=10.244.1.0/24
node_ip=10.0.3.2
sock=/run/containerd/containerd.sock
run=/run/kata-topo-vm
# What the kubelet sets when it starts (protectKernelDefaults off) and the bridge plugin's
# forwarding: saved before, restored by clean.
sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)

say() { echo "node-b: $*" >> "${share}/node-b.log"; }

poll() { # SECONDS COMMAND...
  local n=$1
  shift
  for _ in $(seq 1 "$((n * 2))"); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

# Each process of the namespace under a supervisor, as systemd's Restart=always would.
supervise() { # NAME COMMAND...
  local name=$1
  shift
  (
    child=""
    trap 'kill -TERM "${child}" 2> /dev/null; wait "${child}" 2> /dev/null; exit 0' TERM
    while :; do
      "$@" < /dev/null >> "${share}/${name}.log" 2>&1 &
      child=$!
      echo "${child}" > "${run}/${name}.pid"
      wait "${child}" || true
      sleep 1
    done
  ) &
}

setup() {
  local k8s=${KT_K8S_BIN:?} ws=${WORKSPACE:?} c
  # The node's own filesystem view: a fresh /run, its own /var/lib and /opt (where the installer
  # puts kata-topo), and /var/log on the share (the guest follows the installer's pod logs).
  mkdir -p "${dir}/var-lib" "${dir}/opt" "${share}/var-log"
  mount -t tmpfs -o mode=0755 tmpfs /run
  mount --bind "${dir}/var-lib" /var/lib
  mount --bind "${dir}/opt" /opt
  mount --bind "${share}/var-log" /var/log
  mkdir -p /run/containerd /run/netns "${run}/bin" "${run}/cni/conf" "${run}/containerd.d" /var/lib/kubelet \
    /var/lib/containerd /var/lib/prometheus/node-exporter /var/log/pods
  # The cgroup root the kubelet puts its pods under, in every v1 hierarchy (cpuset's needs its
  # CPUs and memory nodes before a task can join).
  for c in /sys/fs/cgroup/*/; do
    case "${c}" in */unified/) continue ;; esac
    mkdir -p "${c}${cgroup_root}"
  done
  cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/${cgroup_root}/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/${cgroup_root}/cpuset.mems"
  ln -sf "${ws}/target/debug/containerd-shim-kata-topo-v2" "${run}/bin/containerd-shim-kata-topo-v2"
  install -m 0600 "${NODE_B_KUBECONFIG:?}" "${run}/kubelet.kubeconfig"
  mkdir -p "${share}/state" "${share}/metrics"
  local templates=${ws}/integration/templates
  "${templates}/render.sh" "${templates}/topology-guard.toml" DELEGATE=containerd-shim-runc-v2 \
    MODE=audit POLICY=restricted SYSFS=/sys STATE_DIR="${share}/state" LOG_FILE="${share}/kata-topo.log" \
    METRICS_DIR="${share}/metrics" REFRESH_SECONDS=5 KUBELET_TIMEOUT_MS=2000 \
    KUBECONFIG="${run}/kubelet.kubeconfig" NODE_NAME="${node}" API_TIMEOUT_MS=5000 \
    > "${run}/kata-topo.toml"
  "${templates}/render.sh" "${templates}/containerd.toml" V2=1 IMPORTS="${run}/containerd.d/*.toml" \
    ROOT=/var/lib/containerd STATE=/run/containerd ADDRESS="${sock}" \
    SANDBOX_IMAGE=localhost/kata-topo/pause:1 CNI="${run}/cni" DEBUG=1 > "${run}/containerd.toml"
  "${templates}/render.sh" "${templates}/restart-containerd" PID_FILE="${run}/containerd.pid" \
    CTR="$(command -v ctr)" ADDRESS="${sock}" > "${run}/restart-containerd"
  chmod 0755 "${run}/restart-containerd"
  ln -sfn "${k8s}/cni" "${run}/cni/bin"
  "${templates}/render.sh" "${ws}/integration/k8s-test/cni.conflist" BRIDGE="${bridge}" POD_CIDR="${pod_cidr}" \
    > "${run}/cni/conf/10-kata-topo.conflist"
  supervise containerd env PATH="${run}/bin:${PATH}" KATA_TOPO_CONFIG="${run}/kata-topo.toml" \
    containerd --config "${run}/containerd.toml"
  poll 60 ctr -a "${sock}" version || { say "containerd did not come up"; return 1; }
  local image
  for image in pause busybox; do
    ctr -a "${sock}" -n k8s.io images import "${ws}/target/kata-topo-images/${image}.tar" > /dev/null
  done
  # The installer's images, when the run built them (its story runs).
  for image in "${ws}"/target/kata-topo-images/installer-*.tar; do
    [ -e "${image}" ] || continue
    ctr -a "${sock}" -n k8s.io images import "${image}" > /dev/null
  done
  ctr -a "${sock}" -n k8s.io images tag localhost/kata-topo/busybox:1 localhost/kata-topo/busybox:2 > /dev/null
  containerd --version > "${share}/containerd.version"
  say "$(cat "${share}/containerd.version") up, images imported"
}

kubelet_config() {
  cat << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
enableServer: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /${cgroup_root}
failCgroupV1: false
containerRuntimeEndpoint: unix://${sock}
failSwapOn: false
resolvConf: ""
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%", imagefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 20
EOF
}

start_kubelet() {
  local k8s=${KT_K8S_BIN:?}
  kubelet_config > /var/lib/kubelet/config.yaml
  "${k8s}/kubelet" --version > "${share}/kubelet.version" 2>&1 || true
  supervise kubelet "${k8s}/kubelet" --config /var/lib/kubelet/config.yaml \
    --kubeconfig "${run}/kubelet.kubeconfig" --root-dir /var/lib/kubelet \
    --hostname-override "${node}" --node-ip "${node_ip}" --v 2
  say "kubelet started"
}

run_node() {
  : > "${share}/node-b.log"
  # The node's address, on the loopback link (the kubelet refuses a loopback address, 127/8,
  # and wants one a link of this host holds; the machine's own may change, this one is known).
  if ! ip addr add "${node_ip}/32" dev lo; then
    echo failed > "${share}/status"
    exit 1
  fi
  if ! setup; then
    echo failed > "${share}/status"
    exit 1
  fi
  echo containerd > "${share}/status"
  while [ ! -e "${share}/start" ]; do sleep 1; done
  start_kubelet
  echo kubelet > "${share}/status"
  # What the guest asks of this node, answered from inside its namespaces: SHARE/ask-WHAT (its
  # content the argument, if any) -> SHARE/WHAT (status: status.json), WHAT one of answer's.
  # PID 1 of the namespace must not end on a failed answer: errors are the answer's.
  set +e
  local what arg
  while :; do
    for what in leftovers status files containerd stamp dropin follow; do
      [ -e "${share}/ask-${what}" ] || continue
      arg=$(cat "${share}/ask-${what}")
      rm -f "${share}/ask-${what}"
      answer "${what}" "${arg}" > "${share}/${what}.tmp" 2>&1
      mv "${share}/${what}.tmp" "${share}/${what}$([ "${what}" = status ] && echo .json)"
    done
    sleep 0.5
  done
}

answer() { # WHAT [ARG]
  local f
  case "$1" in
    # What of its pods is still here.
    leftovers) leftovers ;;
    # kata-topo status --json, which sees the node's wrapper processes alive.
    status) "${WORKSPACE:?}/target/debug/kata-topo" status --state-dir "${share}/state" --json ;;
    # The files the installer may touch (the installer's steps compare them).
    files) bash "${WORKSPACE:?}/integration/k8s-test/node-files.sh" "${run}" ;;
    # The containerd the supervisor runs (its pid: a restart changes it).
    containerd) cat "${run}/containerd.pid" ;;
    # The version the installer's image stamped into the shim it put here.
    # The configuration version of the handler the installer dropped where containerd imports.
    dropin) cat "${run}"/containerd.d/*.toml 2> /dev/null | grep -m1 '^version' ;;
    # Kube-system pod ARG's installer log kept in SHARE/follow-ARG.log while it runs and ends
    # (the kubelet removes a deleted pod's log directory; the guest's own tail cannot follow a
    # file this side writes).
    follow)
      f=$(find /var/log/pods -path "*/kube-system_${2}_*/installer/*.log" 2> /dev/null | head -n 1)
      if [ -n "${f}" ]; then
        tail -n +1 -F "${f}" > "${share}/follow-${2}.log" 2> /dev/null &
        echo "following ${f}"
      else
        echo "no log of ${2}"
      fi
      ;;
    stamp) readelf -p .kata_topo_image /opt/kata-topo/bin/containerd-shim-kata-topo-v2 2> /dev/null \
      | sed -n 's/^ *\[ *0\] *//p' | head -n 1 ;;
  esac
}

# What of the node's pods is still here, as node A's cleanup step counts it: shim processes,
# their sockets, network namespaces, the wrapper's state and metrics. Empty when nothing is.
leftovers() {
  local p argv0 stat
  for p in /proc/[0-9]*; do
    argv0="" stat=""
    read -r -d '' argv0 < "${p}/cmdline" 2> /dev/null || true
    read -r stat < "${p}/stat" 2> /dev/null || true
    case "${argv0}" in
      *containerd-shim*) [[ "${stat##*) }" == Z* ]] || echo "process ${p##*/}: ${argv0}" ;;
    esac
  done
  find /run/containerd/s -mindepth 1 2> /dev/null | sed 's/^/socket /'
  find /run/netns -mindepth 1 2> /dev/null | sed 's/^/netns /'
  # The node-wide topology cache (topology-<key>.xml) is the node's, not a pod's: it stays.
  find "${share}/state" -mindepth 1 -maxdepth 1 ! -name 'topology-*.xml' 2> /dev/null | sed 's/^/state /'
  find "${share}/metrics" -name 'kata-topo-*' 2> /dev/null | sed 's/^/metrics /'
}

clean() {
  local c s v left=""
  for c in /sys/fs/cgroup/*/"${cgroup_root}"; do
    [ -d "${c}" ] || continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      find "${c}" -depth -type d -exec rmdir {} + 2> /dev/null || true
      [ -d "${c}" ] || break
      sleep 0.5
    done
    [ ! -d "${c}" ] || left="${left}cgroup ${c}; "
  done
  ip link del "${bridge}" 2> /dev/null || true
  ip addr del "${node_ip}/32" dev lo 2> /dev/null || true
  if [ -f "${dir}/sysctls" ]; then
    while read -r s v; do
      sysctl -q -w "${s}=${v}" > /dev/null 2>&1 || left="${left}sysctl ${s} not restored; "
    done < "${dir}/sysctls"
  fi
  rm -rf "${dir}"
  [ ! -e "${dir}" ] || left="${left}${dir}; "
  if ip link show "${bridge}" > /dev/null 2>&1; then left="${left}link ${bridge}; "; fi
  if ip -br addr show dev lo | grep -qw "${node_ip}/32"; then left="${left}address ${node_ip} on lo; "; fi
  printf '%s' "${left}"
}

save_sysctls() {
  local s
  mkdir -p "${dir}"
  for s in "${sysctls[@]}"; do
    printf '%s %s\n' "${s}" "$(sysctl -n "${s}")"
  done > "${dir}/sysctls"
}

case "${1:-}" in
  run) run_node ;;
  save) save_sysctls ;;
  clean) clean ;;
  *)
    echo "usage: node-b.sh run|save|clean (host.sh runs it)" >&2
    exit 2
    ;;
esac
