#!/usr/bin/env bash
# The k8s-test guest (integration/vm-test/run.sh k8s-test boots it): the vm-test machine (two
# NUMA nodes: CPU 0 on node 0, CPU 1 on node 1; an e1000e on node 1 rebound to vfio-pci) made a
# real Kubernetes node. containerd with the kata-topo handler delegating to runc, kata-topo's
# VFIO device plugin, and the kubelet of make k8s with the static CPU manager (CPU 0 reserved),
# the single-numa-node Topology Manager and the Static memory manager, registered with the
# kube-apiserver on the host (10.0.2.100:6443, forwarded by QEMU). Every pod and every change
# goes through kubectl; every in-place update the wrapper checks comes from the kubelet.
#
# Each step is appended to /vm-test-results/steps.jsonl as {name, pass, rules, detail}; the
# rules are read from the wrapper's log and its state, never assumed; the detail carries the
# kubectl evidence.
#
#   guest.sh --list-steps   the step names, one a line (the host's report lists them all)
set -euo pipefail

# shellcheck source=integration/k8s-test/steps-affinity.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps-affinity.sh"
# shellcheck source=integration/k8s-test/steps-installer.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps-installer.sh"
results=${results:-/vm-test-results}
# shellcheck source=integration/k8s-test/steps-seed.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps-seed.sh"
# shellcheck source=integration/k8s-test/steps-nri.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps-nri.sh"

# The stories, each its own set-up and steps; `node` (the node's own checks) and `cleanup`
# always run. KT_K8S_STEPS (make k8s-test STEPS=...; the host passes it on in k8s/steps) names
# the stories to run, by story or by one of its steps; all when empty.
declare -A STORY_STEPS=(
  [node]="node pod-network"
  [core]="guaranteed-admission shared-pool-push resize-audit resize-enforce container-restart kubelet-containerd-restart pool-grows kubelet-stopped"
  [node-b]="node-b"
  [installer]="${installer_steps[*]}"
  [affinity]="${AFFINITY_STEPS[*]}"
  [seed]="${SEED_STEPS[*]}"
  [nri]="${NRI_STEPS[*]}"
  [hold]="hold"
  [cleanup]="cleanup host-clean"
)
# hold (make k8s-up) is never among "all": it keeps the cluster up until make k8s-down. node-b
# (the second node joins) comes with the stories that use node B: installer, seed and hold.
STORIES=(node core node-b installer affinity seed nri hold cleanup)
wanted_stories=""
choose_stories() { # SELECTION: sets wanted_stories; an unknown name is an error
  local w s found
  wanted_stories="node cleanup"
  if [ -z "${1// /}" ]; then wanted_stories="${STORIES[*]/hold/}"; return 0; fi
  for w in ${1//,/ }; do
    found=""
    for s in "${STORIES[@]}"; do
      if [ "${w}" = "${s}" ] || grep -qw -- "${w}" <<< "${STORY_STEPS[${s}]}"; then
        found=${s}
        grep -qw "${s}" <<< "${wanted_stories}" || wanted_stories="${wanted_stories} ${s}"
        break
      fi
    done
    [ -n "${found}" ] || { echo "STEPS: no story or step ${w} (stories: ${STORIES[*]})" >&2; return 1; }
  done
  for s in installer seed hold; do
    if grep -qw "${s}" <<< "${wanted_stories}" && ! grep -qw node-b <<< "${wanted_stories}"; then
      wanted_stories="${wanted_stories} node-b"
    fi
  done
}
wanted() { grep -qw -- "$1" <<< "${wanted_stories}"; }
STEPS=()
list_steps() {
  local s
  STEPS=()
  for s in "${STORIES[@]}"; do
    wanted "${s}" || continue
    # shellcheck disable=SC2206 # the lists are words
    STEPS+=(${STORY_STEPS[${s}]})
  done
}

if [ "${1:-}" = --list-steps ]; then
  choose_stories "${KT_K8S_STEPS:-}" || exit 2
  list_steps
  printf '%s\n' "${STEPS[@]}"
  exit 0
fi

# shellcheck source=integration/vm-test/guest-lib.sh
. /kata-topo/integration/vm-test/guest-lib.sh
k8s=/opt/k8s
node=kata-topo-vm
kubelet_root=/var/lib/kubelet
containerd_bin=""

k() { timeout 60 "${k8s}/kubectl" --kubeconfig "${results}/k8s/admin.kubeconfig" "$@"; }
# kubectl for what kustomize builds first (apply -k, delete -k): over a minute under TCG on a
# loaded host.
k_kustomize() { timeout 300 "${k8s}/kubectl" --kubeconfig "${results}/k8s/admin.kubeconfig" "$@"; }

# Polls COMMAND every second for at most SECONDS; its last output is in ${run}/poll.
# A wait of more than 20 s is said on the console (where a slow step spends its time).
poll() { # SECONDS COMMAND...
  local n=$1 t0
  shift
  t0=$(date +%s)
  for _ in $(seq 1 "${n}"); do
    if "$@" > "${run}/poll" 2>&1; then
      [ $(($(date +%s) - t0)) -le 20 ] || say "waited $(($(date +%s) - t0)) s for: $*" >&2
      return 0
    fi
    sleep 1
  done
  say "gave up after $(($(date +%s) - t0)) s waiting for: $*" >&2
  return 1
}

# --- the node -------------------------------------------------------------------------------
setup_network() {
  local i dev=""
  for i in /sys/class/net/*; do
    if [ "$(basename "$(readlink "${i}/device/driver" 2> /dev/null)")" = virtio_net ]; then dev=${i##*/}; fi
  done
  [ -n "${dev}" ] || { setup_error="no virtio-net interface for the API server"; return 1; }
  if ! { ip link set lo up && ip link set "${dev}" up && ip addr add 10.0.2.15/24 dev "${dev}" \
    && ip route add default via 10.0.2.2; }; then
    setup_error="cannot configure ${dev}"
    return 1
  fi
}

# containerd runs under a supervisor, as systemd's Restart=always would: when containerd ends
# it is started again. restart-containerd (the node's restart command, which the installer
# runs on the host) stops it and returns once the next one serves; TERM to the supervisor
# stops both.
containerd_pid=""
start_containerd() {
  (
    child=""
    trap 'kill -TERM "${child}" 2> /dev/null; wait "${child}" 2> /dev/null; exit 0' TERM
    while :; do
      PATH="${run}/bin:${PATH}" KATA_TOPO_CONFIG="${run}/kata-topo.toml" \
        containerd --config "${run}/containerd.toml" < /dev/null >> "${results}/containerd.log" 2>&1 &
      child=$!
      echo "${child}" > "${run}/containerd.pid"
      wait "${child}" || true
      sleep 0.2
    done
  ) &
  containerd_pid=$!
  poll 120 ctr -a "${sock}" version
}

write_restart_containerd() {
  "${templates}/render.sh" "${templates}/restart-containerd" PID_FILE="${run}/containerd.pid" \
    CTR="$(command -v ctr)" ADDRESS="${sock}" > "${run}/restart-containerd" \
    && chmod 0755 "${run}/restart-containerd"
}

# The wrapper reads the node's labels with the kubelet's credentials: a root-only copy of the
# kubelet's kubeconfig (the results share's file is the host's; /etc is the host's read-only).
api_timeout_ms=5000
templates=${ws}/integration/templates
pod_cidr=10.244.0.0/24
setup_containerd() {
  ln -sf "${bin}/containerd-shim-kata-topo-v2" "${run}/bin/containerd-shim-kata-topo-v2" || return 1
  install -m 0600 "${results}/k8s/kubelet.kubeconfig" "${run}/kubelet.kubeconfig" || return 1
  # The wrapper's configuration. intent_source is the default, auto: the kubelet's PodResources
  # socket is there, so a pod's intent is what the kubelet admitted. Under TCG the emulated
  # kubelet answers in tens to hundreds of milliseconds (a real node's, in under 2): the longest
  # wait allowed, not the default 100 ms. The node's labels and the pods' node affinity come
  # from the API server on the host, with the kubelet's credentials, for the node the kubelet
  # registered (--hostname-override). Under TCG a TLS handshake and a GET through QEMU's relay
  # (a process started on the host per connection) take hundreds of milliseconds, and over 2 s
  # for a pod's first two reads when other builds load the host: the longest wait allowed.
  "${templates}/render.sh" "${templates}/topology-guard.toml" DELEGATE=containerd-shim-runc-v2 \
    MODE=audit POLICY=restricted SYSFS=/sys STATE_DIR="${state}" LOG_FILE="${log}" \
    METRICS_DIR="${metrics}" REFRESH_SECONDS=5 KUBELET_TIMEOUT_MS=2000 \
    KUBECONFIG="${run}/kubelet.kubeconfig" NODE_NAME="${node}" API_TIMEOUT_MS="${api_timeout_ms}" \
    > "${run}/kata-topo.toml" || return 1
  # A node's containerd: the kata-topo handler with the pod annotations allow-listed, runc the
  # default, the pod network of cni.conflist (make k8s's CNI plugins); configuration version 3
  # for containerd 2.x. It imports a directory, where the installer's steps drop their handler.
  # Shims get -debug: the wrapper logs each update request whole (event update-request), which
  # the run keeps as the real kubelet's requests.
  # containerd 2.x with NRI on (its default), for the nri story's plugin (the DaemonSet of
  # deploy/nri/); no plugin connects unless that story runs. plugin_request_timeout 8 s: the
  # plugin's nri_answer_ms is 4 s under TCG (steps-nri.sh), never more than half of it.
  local layout=V2=1 nri=()
  if [ -n "${containerd_bin}" ]; then
    layout=V3=1
    nri=(NRI_SOCKET=/run/nri/nri.sock NRI_DIR="${run}/nri" NRI_TIMEOUT=8s)
    mkdir -p /run/nri "${run}/nri/plugins" "${run}/nri/conf.d"
    # The guest's root is a tmpfs without /var/run; a node's /var/run is /run (FHS), where the
    # DaemonSet's hostPath /var/run/nri finds containerd's socket (else the kubelet makes an
    # empty directory there).
    [ -e /var/run ] || ln -s ../run /var/run
  fi
  "${templates}/render.sh" "${templates}/containerd.toml" "${layout}" "${nri[@]}" \
    IMPORTS="${run}/containerd.d/*.toml" ROOT=/var/lib/containerd STATE=/run/containerd \
    ADDRESS="${sock}" SANDBOX_IMAGE=localhost/kata-topo/pause:1 CNI="${run}/cni" DEBUG=1 \
    > "${run}/containerd.toml" || return 1
  mkdir -p "${run}/cni/conf" "${run}/containerd.d" && ln -sfn "${k8s}/cni" "${run}/cni/bin" || return 1
  "${templates}/render.sh" "${ws}/integration/k8s-test/cni.conflist" BRIDGE=kt-cni0 POD_CIDR="${pod_cidr}" \
    > "${run}/cni/conf/10-kata-topo.conflist" || return 1
  CNI_COMMAND=VERSION "${k8s}/cni/bridge" < /dev/null > /dev/null 2>&1 || return 1
  env -u CNI_COMMAND "${k8s}/cni/bridge" < /dev/null 2>&1 | sed -n 1p > "${results}/k8s/cni.version" || true
  write_restart_containerd
  start_containerd || { setup_error="containerd did not come up: $(tail -n 3 "${results}/containerd.log")"; return 1; }
  local image
  for image in pause busybox; do
    ctr -a "${sock}" -n k8s.io images import "${ws}/target/kata-topo-images/${image}.tar" > /dev/null \
      || { setup_error="ctr images import ${image}.tar failed"; return 1; }
  done
  # A second tag of the same image: what the seed story's in-place image change sets.
  ctr -a "${sock}" -n k8s.io images tag localhost/kata-topo/busybox:1 localhost/kata-topo/busybox:2 > /dev/null \
    || { setup_error="ctr images tag busybox:2 failed"; return 1; }
  containerd --version > "${results}/containerd.version"
  say "$(cat "${results}/containerd.version") up, images imported"
}

# The kubelet runs under a supervisor too, as systemd's Restart=always would: a kubelet started
# while containerd's socket is not back yet exits ("get remote runtime typed version failed"),
# and the next one, a second later, finds it. kubelet_pid is the supervisor (TERM stops both);
# ${run}/kubelet.pid names the kubelet itself.
kubelet_pid=""
start_kubelet() {
  (
    child=""
    trap 'kill -TERM "${child}" 2> /dev/null; wait "${child}" 2> /dev/null; exit 0' TERM
    while :; do
      "${k8s}/kubelet" --config "${kubelet_root}/config.yaml" --kubeconfig "${results}/k8s/kubelet.kubeconfig" \
        --root-dir "${kubelet_root}" --hostname-override "${node}" --node-ip 10.0.2.15 --v 2 \
        < /dev/null >> "${results}/kubelet.log" 2>&1 &
      child=$!
      echo "${child}" > "${run}/kubelet.pid"
      wait "${child}" || true
      sleep 1
    done
  ) &
  kubelet_pid=$!
}

# The kubelet of a NUMA node, its configuration where kubeadm puts it (and where the wrapper
# reads the Topology Manager's policy and scope by default): static CPU manager with CPU 0 reserved (allocatable: CPU 1, on
# node 1), single-numa-node Topology Manager, Static memory manager (node 0 holds the reserved
# memory); no server port (nothing on the host dials the node), eviction thresholds low enough
# for a tmpfs root.
setup_kubelet() {
  cat > "${kubelet_root}/config.yaml" << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
enableServer: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://${sock}
cpuManagerPolicy: static
cpuManagerReconcilePeriod: 10s
reservedSystemCPUs: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
memoryManagerPolicy: Static
systemReserved: {memory: 100Mi}
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%", imagefs.inodesFree: "1%"}
reservedMemory:
  - numaNode: 0
    limits: {memory: 200Mi}
failSwapOn: false
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 20
EOF
  "${k8s}/kubelet" --version > "${results}/k8s/kubelet.version" 2>&1 || true
  "${k8s}/kubectl" version --client 2> /dev/null | sed -n 1p > "${results}/k8s/kubectl.version" || true
  start_kubelet
  poll 180 k get node "${node}" \
    || { setup_error="the kubelet did not register: $(tail -n 3 "${results}/kubelet.log")"; return 1; }
  say "$(cat "${results}/k8s/kubelet.version") registered node ${node}"
  # Ready once containerd reports the pod network (cni.conflist) and the node lifecycle
  # controller sees the kubelet's heartbeats; until then the node carries the not-ready taint
  # and the scheduler places nothing there.
  poll 180 node_field_is '{.status.conditions[?(@.type=="Ready")].status}' True \
    || { setup_error="node ${node} did not become Ready: $(k get node "${node}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}')"; return 1; }
  node_json
  # What the RuntimeClass's scheduling asks of a node.
  k label node "${node}" katacontainers.io/kata-runtime=true kata-topo.io/installed=true --overwrite > /dev/null \
    || { setup_error="cannot label the node"; return 1; }
  # The shipped RuntimeClass without its overhead: the delegate here is runc, no VM to pay
  # for, and this node has one allocatable CPU.
  sed '/^overhead:/,/^scheduling:/{/^scheduling:/!d}' "${ws}/deploy/kubernetes/runtimeclass.yaml" \
    | k apply -f - > /dev/null || { setup_error="cannot create the RuntimeClass"; return 1; }
}

# The nodes as the report names them: conditions, taints, allocatable, versions.
node_json() { nodes_json; }
nodes_json() {
  k get nodes -o json 2> /dev/null | jq -c '[.items[] | {name: .metadata.name,
      conditions: [.status.conditions[] | {type, status, reason}],
      taints: (.spec.taints // []), allocatable: .status.allocatable,
      kubelet: .status.nodeInfo.kubeletVersion, runtime: .status.nodeInfo.containerRuntimeVersion}]' \
    > "${results}/k8s/nodes.json.tmp" || true
  mv "${results}/k8s/nodes.json.tmp" "${results}/k8s/nodes.json" 2> /dev/null || true
}

plugin_pid=""
setup_device_plugin() {
  [ -x "${bin}/kata-topo-device-plugin" ] || { setup_error="no ${bin}/kata-topo-device-plugin"; return 1; }
  "${bin}/kata-topo-device-plugin" --device-plugin-dir "${kubelet_root}/device-plugins" \
    < /dev/null >> "${results}/device-plugin.log" 2>&1 &
  plugin_pid=$!
  poll 120 node_field_is '{.status.allocatable.kata-topo\.io/vfio}' 1 \
    || { setup_error="the node never advertised kata-topo.io/vfio: $(tail -n 3 "${results}/device-plugin.log")"; return 1; }
  say "the device plugin advertises kata-topo.io/vfio: 1"
}

# --- pods -----------------------------------------------------------------------------------
# pod NAME QOS [ANNOTATION...]: QOS guaranteed (1 CPU, 256Mi, the VFIO NIC) or burstable
# (no CPU request, a 200m CPU limit, 64Mi/128Mi: the node's one allocatable CPU is the
# Guaranteed pod's), on this node, runtime class kata-topo, host network.
pod() {
  local name=$1 qos=$2 resources annotations="" a
  shift 2
  for a in "$@"; do annotations="${annotations}    ${a%%=*}: \"${a#*=}\"\n"; done
  case "${qos}" in
    guaranteed) resources='requests: {cpu: "1", memory: 256Mi, kata-topo.io/vfio: "1"}
        limits: {cpu: "1", memory: 256Mi, kata-topo.io/vfio: "1"}' ;;
    *) resources='requests: {cpu: "0", memory: 64Mi}
        limits: {cpu: 200m, memory: 128Mi}' ;;
  esac
  printf '%b' "apiVersion: v1
kind: Pod
metadata:
  name: ${name}
${annotations:+  annotations:\n}${annotations}spec:
  nodeSelector: {kubernetes.io/hostname: ${node}}
  runtimeClassName: kata-topo
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: localhost/kata-topo/busybox:1
      imagePullPolicy: Never
      command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while :; do sleep 1; done\"]
      resources:
        ${resources}
" | k apply -f - > /dev/null
}

ready() { # NAME
  [ "$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ]
}

# The latest verdict the wrapper keeps for pod NAME's container app (kata-topo status --json).
verdict_of() { # NAME
  "${bin}/kata-topo" status --state-dir "${state}" --json 2> /dev/null \
    | jq -c --arg p "$1" '[.sandboxes[].verdicts[] | .[1]
        | select(.pod.name == $p and .container_name == "app")] | last // empty'
}

# The baseline the wrapper recorded for pod NAME's container app.
baseline_of() { # NAME
  "${bin}/kata-topo" status --state-dir "${state}" --json 2> /dev/null \
    | jq -c --arg p "$1" '[.sandboxes[] | select(any(.verdicts[]; .[1].pod.name == $p))
        | .containers[] | select(.[0] == "app") | .[1]] | last // empty'
}

# The host CPUs pod NAME's container runs on, as its cgroup says.
cpuset_of() { # NAME
  local id pid
  id=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  pid=$(ctr -a "${sock}" -n k8s.io tasks ls 2> /dev/null | awk -v id="${id}" '$1 == id { print $2 }')
  [ -n "${pid}" ] || return 1
  sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/${pid}/status"
}

memory_max_of() { # NAME: the memory limit in force in the container's cgroup
  local id pid cg
  id=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  pid=$(ctr -a "${sock}" -n k8s.io tasks ls 2> /dev/null | awk -v id="${id}" '$1 == id { print $2 }')
  [ -n "${pid}" ] || return 1
  cg=$(sed -n 's/^0:://p' "/proc/${pid}/cgroup")
  cat "/sys/fs/cgroup${cg}/memory.max"
}

# Whether the wrapper keeps a verdict for pod NAME's container app matching the jq FILTER.
# (kata-topo status exits 1 when it shows a finding: its output is what counts here.)
has_verdict() { # NAME FILTER
  local status
  status=$("${bin}/kata-topo" status --state-dir "${state}" --json 2> /dev/null || true)
  jq -e --arg p "$1" "[.sandboxes[].verdicts[] | .[1] | select(.pod.name == \$p and .container_name == \"app\") | select($2)] | length > 0" \
    <<< "${status}" > /dev/null 2>&1
}

# Whether kubectl's jsonpath PATH of pod NAME is VALUE (is_at_least: a number at least VALUE).
pod_field_is() { [ "$(k get pod "$1" -o jsonpath="$2")" = "$3" ]; }
pod_field_is_at_least() { local v; v=$(k get pod "$1" -o jsonpath="$2"); [ "${v:-0}" -ge "$3" ]; }
pod_field_has() { k get pod "$1" -o jsonpath="$2" | grep -q -- "$3"; }
# Whether pod NAME's container waits with TEXT in its waiting state; that state (JSON) kept in
# ${run}/waiting-NAME when it does. A refused create's state (CreateContainerError, with the
# runtime's message) alternates with the kubelet's back-off (CrashLoopBackOff, without it): a
# second read after the poll may find the other one.
waiting_has() { # NAME TEXT
  local w
  w=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].state.waiting}')
  grep -q -- "$2" <<< "${w}" && printf '%s\n' "${w}" > "${run}/waiting-$1"
}
node_field_is() { [ "$(k get node "${node}" -o jsonpath="$1")" = "$2" ]; }
# (grep without -q: under pipefail, a grep that stops at its first match leaves tail writing
# into a closed pipe, and tail's SIGPIPE fails the pipeline once the log is long.)
logged_since() { tail -n "+$(($1 + 1))" "${log}" | grep -F -- "$2" > /dev/null; }


# --- steps ----------------------------------------------------------------------------------
step_node() {
  local cpu vfio tm
  cpu=$(k get node "${node}" -o jsonpath='{.status.allocatable.cpu}')
  vfio=$(k get node "${node}" -o jsonpath='{.status.allocatable.kata-topo\.io/vfio}')
  tm=$(grep -o 'topologyManagerPolicy: [a-z-]*' "${kubelet_root}/config.yaml")
  local detail
  detail="kubectl get node ${node}: allocatable cpu ${cpu}, kata-topo.io/vfio ${vfio}; ${tm}; $(cat "${results}/k8s/kubelet.version"); RuntimeClass $(k get runtimeclass kata-topo -o jsonpath='{.handler}')"
  if [ "${cpu}" = 1 ] && [ "${vfio}" = 1 ]; then
    record node true "" "${detail}"
  else
    record node false "" "expected allocatable cpu 1 and kata-topo.io/vfio 1: ${detail}"
  fi
}

# A pod on the pod network (not the host's): placed by the scheduler, given an address of the
# node's range by the CNI plugins, reachable from the node over the bridge.
step_pod_network() {
  local ip detail sched
  k apply -f - > /dev/null << EOF || { record pod-network false "" "kubectl apply kt-net failed"; return 1; }
apiVersion: v1
kind: Pod
metadata: {name: kt-net}
spec:
  runtimeClassName: kata-topo
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: localhost/kata-topo/busybox:1
      imagePullPolicy: Never
      command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
      resources:
        requests: {cpu: "0", memory: 16Mi}
        limits: {cpu: 100m, memory: 32Mi}
EOF
  poll 180 ready kt-net || true
  ip=$(k get pod kt-net -o jsonpath='{.status.podIP}')
  sched=$(k get events --field-selector involvedObject.name=kt-net,reason=Scheduled -o jsonpath='{.items[0].message}' 2> /dev/null || true)
  detail="kubectl get pod kt-net: ready $(k get pod kt-net -o jsonpath='{.status.containerStatuses[0].ready}'), node $(k get pod kt-net -o jsonpath='{.spec.nodeName}'), podIP ${ip:-none} (range ${pod_cidr}); Scheduled: ${sched:-none}; ping from the node: $(busybox ping -c 1 -W 5 "${ip:-0.0.0.0}" > /dev/null 2>&1 && echo answered || echo 'no answer')"
  k delete pod kt-net --wait=true --timeout=120s > /dev/null 2>&1 || true
  if [ "${ip%.*}" = "${pod_cidr%.*}" ] && grep -q "to ${node}" <<< "${sched}" && grep -q answered <<< "${detail}"; then
    record pod-network true "" "${detail}"
  else
    record pod-network false "" "expected kt-net scheduled to ${node} with an address of ${pod_cidr} that answers: ${detail}"
  fi
}

# (b, first half) A shared-pool pod runs on CPUs 0-1, both nodes; when the Guaranteed pod
# takes CPU 1 the CPU manager's reconcile loop pushes it to CPU 0: a cpuset update within its
# baseline, checked, not reported.
shared_mark=0
start_shared_pod() {
  shared_mark=$(log_mark)
  pod kt-shared burstable
  poll 180 ready kt-shared || return 1
  say "kt-shared runs on CPUs $(cpuset_of kt-shared)"
}

# The core story's first step: the shared-pool pod started, then the Guaranteed pod.
core_admission() {
  start_shared_pod || true
  step_guaranteed_admission
}

# (a) A Guaranteed pod with the VFIO NIC, admitted by the Topology Manager on node 1.
step_guaranteed_admission() {
  local mark rules cpus alloc dev
  mark=$(log_mark)
  pod kt-gpu guaranteed
  if ! poll 240 ready kt-gpu; then
    record guaranteed-admission false "" "kt-gpu not ready: $(k get pod kt-gpu -o jsonpath='{.status}' | cut -c 1-400)"
    return 1
  fi
  cpus=$(cpuset_of kt-gpu || echo "?")
  dev=$(k get pod kt-gpu -o jsonpath='{.spec.containers[0].resources.limits.kata-topo\.io/vfio}')
  alloc=$(baseline_of kt-gpu | jq -r '[.devices[] | "\(.path) (\(.bus_id), node \(.numa_nodes // "unknown"))"] | join(", ")' 2> /dev/null || true)
  rules=$(rules_since "${mark}" '.pod_name == "kt-gpu"')
  # What the kubelet's PodResources API reports now (kept as a recording of the real kubelet).
  "${k8s}/podresources" > "${results}/pod-resources-list.json" 2> /dev/null || true
  "${k8s}/podresources" --allocatable > "${results}/pod-resources-allocatable.json" 2> /dev/null || true
  # The pod has no kata-topo annotation: its intent is what the kubelet admitted.
  local v intent
  v=$(verdict_of kt-gpu)
  intent=$(jq -c '{intent_source, policy, kubelet: (.kubelet // {} | {cpus, numa_nodes, memory_nodes, devices: [.devices[]?.device_ids[]]})}' <<< "${v:-null}" 2> /dev/null || echo null)
  local detail
  detail="kubectl: kt-gpu Ready, QoS $(k get pod kt-gpu -o jsonpath='{.status.qosClass}'), kata-topo.io/vfio ${dev}; runs on CPU ${cpus}; VFIO in its baseline: ${alloc:-none}; intent: ${intent}"
  if [ -z "${rules}" ] && [ "${cpus}" = 1 ] && [ -n "${alloc}" ] \
    && jq -e --arg nic "${nic}" '.intent_source == "kubelet" and .policy == "single-numa-node"
        and .kubelet.cpus == "1" and .kubelet.numa_nodes == "1"
        and ([.kubelet.devices[]?.device_ids[]] | index($nic) != null)' <<< "${v:-null}" > /dev/null; then
    record guaranteed-admission true "" "${detail}"
  else
    record guaranteed-admission false "${rules}" "expected CPU 1, the NIC in its baseline, no finding and the kubelet's admission as the intent: ${detail}"
  fi
}

step_shared_pool_push() {
  local v cpus rules
  poll 60 has_verdict kt-shared '.operation == "update" and .class == "cpuset"' || true
  v=$(verdict_of kt-shared)
  cpus=$(cpuset_of kt-shared || echo "?")
  rules=$(rules_since "${shared_mark}" '.pod_name == "kt-shared"')
  local detail
  detail="kt-shared now on CPU ${cpus}; its latest verdict: $(jq -c '{operation, class, decision, findings: [.findings[].rule]}' <<< "${v:-null}")"
  if [ -n "${v}" ] && jq -e '.operation == "update" and .class == "cpuset" and (.findings | length == 0)' <<< "${v}" > /dev/null \
    && [ "${cpus}" = 0 ] && [ -z "${rules}" ]; then
    record shared-pool-push true "" "the kubelet pushed cpuset 0 (CPU manager reconcile); ${detail}"
  else
    record shared-pool-push false "${rules}" "expected a clean cpuset update to CPU 0: ${detail}"
  fi
}

# (c) kt-late starts while the shared pool is CPU 0 (its baseline: node 0); a resize of its
# memory limit beyond node 0's memory goes through in audit mode, and is reported.
node0_mib() { jq '.numa_nodes[] | select(.os_index == 0) | .memory_bytes / 1048576 | floor' "${results}/topology.json"; }
resize_memory() { # NAME MIB
  k patch pod "$1" --subresource resize --type strategic \
    -p "{\"spec\":{\"containers\":[{\"name\":\"app\",\"resources\":{\"limits\":{\"memory\":\"$2Mi\"}}}]}}"
}

step_resize_audit() {
  local mark ask rules applied events_pid status rc=0
  pod kt-late burstable || true
  poll 180 ready kt-late || { record resize-audit false "" "kt-late not ready"; return 1; }
  "${bin}/kata-topo" events --address "${sock}" > "${run}/events" 2> /dev/null &
  events_pid=$!
  sleep 1
  ask=$(($(node0_mib) + 256))
  mark=$(log_mark)
  resize_memory kt-late "${ask}" > "${run}/patch" 2>&1 || rc=$?
  poll 120 pod_field_is kt-late '{.status.containerStatuses[0].resources.limits.memory}' "${ask}Mi" || true
  applied=$(k get pod kt-late -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  poll 20 grep -q memory-exceeds-nodes "${run}/events" || true
  kill "${events_pid}" 2> /dev/null || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-late" and .operation == "update" and .decision == "allow"')
  status=$("${bin}/kata-topo" status --state-dir "${state}" 2>&1 | grep kt-late -A 20 | grep -c memory-exceeds-nodes || true)
  local metric
  metric=$(cat "${metrics}"/kata-topo-*.prom 2> /dev/null | grep -c 'kata_topo_findings_total{.*rule="memory-exceeds-nodes"' || true)
  local detail
  detail="kubectl patch --subresource resize: memory limit ${ask}Mi (node 0 has $(node0_mib) MiB), exit ${rc}; status.containerStatuses[0].resources.limits.memory=${applied}; kata-topo events: $(grep -c memory-exceeds-nodes "${run}/events" || true) line(s); kata-topo status: ${status}; metric series: ${metric}"
  if [ "${rules}" = memory-exceeds-nodes ] && [ "${applied}" = "${ask}Mi" ] && grep -q memory-exceeds-nodes "${run}/events" \
    && [ "${metric}" -ge 1 ]; then
    record resize-audit true "${rules}" "${detail}"
  else
    record resize-audit false "${rules}" "expected memory-exceeds-nodes, allowed, in the log, the events and the metrics: ${detail}"
  fi
}

# (d) The same resize of an enforce pod: refused; the user sees why through kubectl.
enforce_mark=0
enforce_ask=0
step_resize_enforce() {
  local rules cond applied memmax
  pod kt-enforce burstable kata-topo.io/mode=enforce || true
  poll 180 ready kt-enforce || { record resize-enforce false "" "kt-enforce not ready"; return 1; }
  enforce_ask=$(($(node0_mib) + 256))
  enforce_mark=$(log_mark)
  resize_memory kt-enforce "${enforce_ask}" > /dev/null 2>&1 || true
  poll 120 pod_field_has kt-enforce '{.status.conditions[?(@.type=="PodResizeInProgress")].message}' kata-topo || true
  cond=$(k get pod kt-enforce -o jsonpath='{.status.conditions[?(@.type=="PodResizeInProgress")]}')
  k get pod kt-enforce -o json > "${results}/kt-enforce.json" 2> /dev/null || true
  k get events --field-selector involvedObject.name=kt-enforce -o json > "${results}/kt-enforce-events.json" 2> /dev/null || true
  applied=$(k get pod kt-enforce -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  memmax=$(memory_max_of kt-enforce || echo "?")
  rules=$(rules_since "${enforce_mark}" '.pod_name == "kt-enforce" and .operation == "update" and .decision == "reject"')
  local detail
  detail="kubectl get pod kt-enforce: PodResizeInProgress ${cond:-absent}; limits.memory in force ${applied}, cgroup memory.max ${memmax}"
  if [ "${rules}" = memory-exceeds-nodes ] && grep -q 'kata-topo' <<< "${cond}" && grep -q 'memory-exceeds-nodes' <<< "${cond}" \
    && [ "${applied}" = 128Mi ] && [ "${memmax}" = $((128 << 20)) ]; then
    record resize-enforce true "${rules}" "$(cut -c 1-900 <<< "${detail}")"
  else
    record resize-enforce false "${rules}" "expected the refusal in the pod's resize condition and the old limit in force: $(cut -c 1-900 <<< "${detail}")"
  fi
}

# (e) The container of kt-gpu killed: the kubelet restarts it in its running sandbox.
step_container_restart() {
  local id pid mark rules v restarts
  id=$(k get pod kt-gpu -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  mark=$(log_mark)
  ctr -a "${sock}" -n k8s.io tasks kill -s KILL "${id}" > /dev/null 2>&1 \
    || { record container-restart false "" "cannot kill ${id}"; return 1; }
  poll 120 pod_field_is_at_least kt-gpu '{.status.containerStatuses[0].restartCount}' 1 || true
  poll 120 ready kt-gpu || true
  restarts=$(k get pod kt-gpu -o jsonpath='{.status.containerStatuses[0].restartCount}')
  v=$(verdict_of kt-gpu)
  rules=$(rules_since "${mark}" '.pod_name == "kt-gpu"')
  local detail
  detail="kubectl: kt-gpu restartCount ${restarts}, ready $(k get pod kt-gpu -o jsonpath='{.status.containerStatuses[0].ready}'), CPU $(cpuset_of kt-gpu || echo '?'); latest verdict: $(jq -c '{operation, decision, findings: [.findings[].rule]}' <<< "${v:-null}")"
  if [ "${restarts:-0}" -ge 1 ] && [ -n "${v}" ] && jq -e '.operation == "recreate"' <<< "${v}" > /dev/null && [ -z "${rules}" ]; then
    record container-restart true "" "${detail}"
  else
    record container-restart false "${rules}" "expected a clean recreate check: ${detail}"
  fi
}

# (f) The kubelet restarted while the pods run, then containerd: checks go on, nothing is
# announced twice, no wrapper is replaced.
wrappers() {
  local p argv0
  for p in /proc/[0-9]*; do
    argv0=""
    read -r -d '' argv0 < "${p}/cmdline" 2> /dev/null || true
    case "${argv0}" in *containerd-shim-kata-topo-v2) echo "${p##*/}" ;; esac
  done | sort | paste -sd ' ' -
}

# The restarted kubelet serves again: the device plugin registered with it anew (its
# PodResources API lists the VFIO device as allocatable).
kubelet_serves_again() {
  "${k8s}/podresources" --allocatable 2> /dev/null | grep '"resourceName": *"kata-topo.io/vfio"' > /dev/null
}

step_kubelet_containerd_restart() {
  local before after mark findings running t0 back
  before=$(wrappers)
  mark=$(log_mark)
  kill -TERM "${kubelet_pid}" 2> /dev/null || true
  wait "${kubelet_pid}" 2> /dev/null || true
  t0=$(date +%s)
  start_kubelet
  # containerd is restarted only once the kubelet serves again, as an operator restarting one
  # after the other would. A kubelet that loses its runtime while it starts takes its list of
  # running containers from a failed call and, until the device plugin registers again, rejects
  # a running pod holding a device (UnexpectedAdmissionError: the kubelet's own race,
  # kubernetes/kubernetes#133382); kt-gpu then ends, whatever the runtime.
  if ! poll 180 kubelet_serves_again; then
    record kubelet-containerd-restart false "" "the restarted kubelet did not list kata-topo.io/vfio as allocatable within 180 s: $(tail -n 3 "${results}/kubelet.log" | cut -c 1-600)"
    return 1
  fi
  back=$(($(date +%s) - t0))
  kill -TERM "${containerd_pid}" 2> /dev/null || true
  wait "${containerd_pid}" 2> /dev/null || true
  start_containerd || { record kubelet-containerd-restart false "" "containerd did not come back"; return 1; }
  # The kubelet's retries of kt-enforce's refused resize went on meanwhile; give the
  # restarted kubelet a few of them, then nothing may have been announced.
  sleep 10
  findings=$(tail -n "+$((mark + 1))" "${log}" | grep -c '"event":"finding"' || true)
  # Checks go on: kt-late's memory limit raised further after both restarts is checked and,
  # being a new finding, announced.
  local again=$(($(node0_mib) + 320)) resized
  mark=$(log_mark)
  resize_memory kt-late "${again}" > /dev/null 2>&1 || true
  poll 120 logged_since "${mark}" '"pod_name":"kt-late"' || true
  resized=$(rules_since "${mark}" '.pod_name == "kt-late" and .class == "resize"')
  running=$(k get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase}/{.status.containerStatuses[0].restartCount} {end}')
  after=$(wrappers)
  # The CPU manager pushes kt-gpu's exclusive CPU to it after each start and after its own
  # restart: each push checked against what the kubelet admitted, and clean.
  local gpu
  gpu=$(verdict_of kt-gpu)
  local detail
  detail="the kubelet served again after ${back} s; wrapper pids before [${before}] after [${after}]; pods ${running}; findings logged across the restarts: ${findings}; kt-late resized to ${again}Mi after them: [${resized}]; kt-gpu's latest verdict: $(jq -c '{operation, class, intent_source, kubelet_cpus: .kubelet.cpus, findings: [.findings[].rule]}' <<< "${gpu:-null}" 2> /dev/null)"
  if [ "${before}" = "${after}" ] && [ -n "${before}" ] && [ "${findings}" = 0 ] \
    && [ "${resized}" = memory-exceeds-nodes ] \
    && jq -e '.operation == "update" and .intent_source == "kubelet" and .kubelet.cpus == "1"
        and (.findings | length) == 0' <<< "${gpu:-null}" > /dev/null; then
    record kubelet-containerd-restart true "" "${detail}"
  else
    record kubelet-containerd-restart false "" "expected the same wrappers, no finding announced again, the resize after the restarts checked, and kt-gpu's cpuset pushes checked against the kubelet's admission: ${detail}"
  fi
}

# (b, second half) kt-gpu deleted: the shared pool grows back to CPUs 0-1, and the CPU
# manager pushes it to every shared-pool container; for kt-late (baseline node 0) that crosses
# into node 1 and is reported; kt-enforce's push is refused, and the kubelet retries it.
step_pool_grows() {
  local mark rules late enforce retries
  mark=$(log_mark)
  k delete pod kt-gpu --wait=true --timeout=120s > /dev/null 2>&1 || true
  poll 90 logged_since "${mark}" '"pod_name":"kt-late"' || true
  sleep 12
  late=$(cpuset_of kt-late || echo "?")
  enforce=$(cpuset_of kt-enforce || echo "?")
  rules=$(rules_since "${mark}" '.pod_name == "kt-late" and .operation == "update" and .class == "cpuset"')
  retries=$(grep -c 'UpdateContainerResources from runtime service failed.*kt-enforce.*cpu-outside-intent' "${results}/kubelet.log" || true)
  local detail
  detail="kt-gpu deleted; kt-late now on CPUs ${late} ($(rules_since "${mark}" '.pod_name == "kt-late"')); kt-enforce on ${enforce} ($(rules_since "${mark}" '.pod_name == "kt-enforce" and .decision == "reject"') refused); the kubelet's refused pushes so far: ${retries}"
  if grep -qw cpu-outside-intent <<< "${rules}" && [ "${late}" = 0-1 ] && [ "${enforce}" = 0 ]; then
    record pool-grows true "${rules}" "${detail}"
  else
    record pool-grows false "${rules}" "expected cpu-outside-intent for kt-late's push to 0-1 and kt-enforce kept on 0: ${detail}"
  fi
}

# The kubelet stopped (SIGSTOP: its PodResources socket accepts and never answers) while a
# resize arrives through CRI: the update waits at most kubelet_timeout_ms (2 s here) for it,
# goes through, and says why the kubelet's intent is missing.
step_kubelet_stopped() {
  local id mark rc=0 t0 t1 ms rules mib
  id=$(k get pod kt-late -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  mib=$(($(node0_mib) + 384))
  local kubelet
  kubelet=$(cat "${run}/kubelet.pid" 2> /dev/null || true)
  kill -STOP "${kubelet:-0}" 2> /dev/null || { record kubelet-stopped false "" "no kubelet to stop"; return 1; }
  mark=$(log_mark)
  t0=$(date +%s%N)
  cri update "${id}" --cpus 0-1 --memory $((mib << 20)) 2> "${run}/err" || rc=$?
  t1=$(date +%s%N)
  kill -CONT "${kubelet}" 2> /dev/null || true
  ms=$(((t1 - t0) / 1000000))
  poll 20 logged_since "${mark}" 'kubelet-intent-unavailable' || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-late" and .operation == "update"')
  local why detail
  why=$(tail -n "+$((mark + 1))" "${log}" | jq -R -r 'fromjson? | select(.rule == "kubelet-intent-unavailable") | .msg' | head -n 1)
  detail="kubelet stopped; kt-late resized to ${mib}Mi through CRI in ${ms} ms (the whole CRI call under TCG), exit ${rc}$( [ -s "${run}/err" ] && echo " ($(head -c 200 "${run}/err"))"); ${why}"
  if [ "${rc}" = 0 ] && grep -qw kubelet-intent-unavailable <<< "${rules}"; then
    record kubelet-stopped true "${rules}" "${detail}"
  else
    record kubelet-stopped false "${rules}" "expected the update through with kubelet-intent-unavailable: ${detail}"
  fi
}

# (g) Every pod deleted with kubectl: nothing left. Also: the enforce pod's refused resize,
# retried by the kubelet all along (about once a second), was announced once.
relabel_mark=""
step_cleanup() {
  local once retries left=""
  # Counted up to the steps that change the node's labels (the installer's and the node
  # affinity's): kt-enforce's retries read the node too, and its RuntimeClass's scheduling put
  # kata-topo.io/installed in its nodeSelector, so each relabelling, and the API server's
  # outage, changes its verdict, which is news.
  once=$(tail -n "+$((enforce_mark + 1))" "${log}" | head -n "$((${relabel_mark:-$(log_mark)} - enforce_mark))" \
    | jq -R -r 'fromjson? | select(.event == "finding" and .pod_name == "kt-enforce" and .class == "resize") | .rule' | wc -l)
  retries=$(grep -c 'UpdateContainerResources from runtime service failed.*kt-enforce.*memory-exceeds-nodes' "${results}/kubelet.log" || true)
  k delete pods --all --wait=true --timeout=180s > /dev/null 2>&1 || true
  for _ in $(seq 1 150); do
    left=$(leftovers)
    [ -z "${left}" ] && break
    sleep 0.2
  done
  # Node B (when it joined): nothing of its pods left on the host either.
  local b_left=""
  for _ in $(seq 1 10); do
    b_left=$(node_b_leftovers)
    [ -z "${b_left}" ] && break
    sleep 2
  done
  left="${left}${left:+${b_left:+$'\n'}}${b_left}"
  local status rc=0
  status=$("${bin}/kata-topo" status --state-dir "${state}" 2>&1) || rc=$?
  status=$(head -n 1 <<< "${status}")
  local detail
  detail="kubectl delete pods --all; pods left: $(k get pods -o name | wc -l); kt-enforce's refused resize: ${retries} tries by the kubelet, announced ${once} time(s); kata-topo status exit ${rc}: ${status}"
  # The refused resize's count is the core story's (kt-enforce is its pod).
  local enforce_ok=yes
  if wanted core; then
    [ "${once}" = 1 ] && [ "${retries}" -ge 2 ] || enforce_ok=no
  else
    detail="${detail} (the core story did not run: no kt-enforce to count)"
  fi
  if [ -z "${left}" ] && [ "${rc}" = 0 ] && [ "${enforce_ok}" = yes ]; then
    record cleanup true "" "${detail}; no shim process, socket, state or metrics left"
  else
    record cleanup false "" "${detail}; left: $(paste -sd ';' - <<< "${left}" | cut -c 1-600)"
  fi
}

# --- stories ----------------------------------------------------------------------------------
# begin_story NAME; st STEP FUNCTION...; end_story: a story's steps in order. Once one fails, the
# rest of the story are recorded not run at once (what they build on failed) and the next story
# runs on its own set-up. Each step's and each story's time is kept (steps.jsonl, stories.jsonl).
story_name="" story_failed="" story_t0=0
begin_story() {
  story_name=$1 story_failed="" story_t0=$(date +%s)
  say "story ${story_name}"
}
# Whether step NAME's latest result passed: a make k8s-run run's own, else the cluster's (the
# node and node-b steps, which a run does not run again).
step_passed() {
  local f
  for f in ${steps_out:+"${steps_out}"} "${results}/steps.jsonl"; do
    if grep -F "\"name\":\"$1\"" "${f}" > /dev/null 2>&1; then
      grep -F "\"name\":\"$1\"" "${f}" | tail -n 1 | grep -F '"pass":true' > /dev/null
      return
    fi
  done
  return 1
}
st() { # STEP FUNCTION
  local step=$1
  shift
  if [ -n "${story_failed}" ]; then
    record "${step}" false "" "not run: ${story_failed} failed before it in story ${story_name}"
    return 0
  fi
  step_t0=$(date +%s)
  "$@" || true
  step_passed "${step}" || story_failed=${step}
}
end_story() {
  local seconds=$(($(date +%s) - story_t0))
  jq -cn --arg s "${story_name}" --argjson t "${seconds}" --arg f "${story_failed}" \
    '{story: $s, seconds: $t, failed: (if $f == "" then null else $f end)}' >> "${stories_out:-${results}/stories.jsonl}"
  say "story ${story_name}: ${seconds} s${story_failed:+, ${story_failed} failed}"
}

# make k8s-up: the cluster kept as it is for a person with kubectl until make k8s-down asks
# (k8s/release on the results share) or the guest's time runs out.
step_hold() {
  local t0 req
  t0=$(date +%s)
  : > "${results}/k8s/held"
  say "held: both nodes up; make k8s-down ends it, make k8s-run STEPS=... runs stories on it"
  while [ ! -e "${results}/k8s/release" ]; do
    for req in "${results}"/k8s/run-*.request; do
      [ -e "${req}" ] && serve_run "${req}"
    done
    sleep 2
  done
  record hold true "" "the cluster held for $(($(date +%s) - t0)) s, released by make k8s-down"
}

# make k8s-run: the stories a request file names (run-ID.request, written by the host) run on
# the held cluster, with their steps and stories in run-ID/ and run-ID/done written last. The
# node is up already: `node`, `node-b` and `hold` are not run again; `cleanup` ends every run
# (it deletes the pods of the default namespace and checks nothing is left).
serve_run() { # REQUEST
  local req=$1 id selection held_steps=("${STEPS[@]}") held_wanted=${wanted_stories} s
  local held_story=("${story_name}" "${story_failed}" "${story_t0}" "${step_t0}")
  id=${req##*/run-}
  id=${id%.request}
  selection=$(cat "${req}")
  rm -f "${req}"
  local out=${results}/k8s/run-${id}
  mkdir -p "${out}"
  steps_out=${out}/steps.jsonl stories_out=${out}/stories.jsonl
  : > "${steps_out}"
  : > "${stories_out}"
  say "k8s-run ${id}: ${selection}"
  if choose_stories "${selection}" 2> "${out}/error"; then
    wanted_stories=$(tr ' ' '\n' <<< "${wanted_stories}" | grep -vxE 'node|node-b|hold' | paste -sd ' ' -)
    STEPS=()
    for s in "${STORIES[@]}"; do
      # shellcheck disable=SC2206 # the lists are words
      wanted "${s}" && STEPS+=(${STORY_STEPS[${s}]})
    done
    # host-clean is the host's own check once the whole cluster is down.
    local kept=() n
    for n in "${STEPS[@]}"; do [ "${n}" = host-clean ] || kept+=("${n}"); done
    STEPS=("${kept[@]}")
    relabel_mark=""
    run_stories
    fail_rest "the step ended without recording a result"
  fi
  steps_out="" stories_out=""
  STEPS=("${held_steps[@]}") wanted_stories=${held_wanted}
  story_name=${held_story[0]} story_failed=${held_story[1]} story_t0=${held_story[2]} step_t0=${held_story[3]}
  : > "${out}/done"
}

installer_teardown() {
  inst_restore
  local p
  for p in "${inst_follow_pids[@]}"; do kill "${p}" 2> /dev/null || true; done
}

# --- the run ----------------------------------------------------------------------------------
# The stories chosen, in their order, then cleanup (the node's own story runs before them).
run_stories() {
  if wanted core; then
    begin_story core
    st guaranteed-admission core_admission
    st shared-pool-push step_shared_pool_push
    st resize-audit step_resize_audit
    st resize-enforce step_resize_enforce
    st container-restart step_container_restart
    st kubelet-containerd-restart step_kubelet_containerd_restart
    st pool-grows step_pool_grows
    st kubelet-stopped step_kubelet_stopped
    end_story
  fi
  relabel_mark=$(log_mark)
  if wanted node-b; then
    begin_story node-b
    st node-b step_node_b
    end_story
  fi
  if wanted installer; then
    begin_story installer
    inst_dir=${run}/installer
    st installer-install step_installer_install
    st installer-pod step_installer_pod
    st installer-upgrade step_installer_upgrade
    st installer-restart-resize step_installer_restart_resize
    st installer-removal step_installer_removal
    installer_teardown
    end_story
  fi
  if wanted affinity; then
    begin_story affinity
    st affinity-violated-audit step_affinity_violated_audit
    st affinity-violated-enforce step_affinity_violated_enforce
    st affinity-labels-changed step_affinity_labels_changed
    st affinity-api-unreachable step_affinity_api_unreachable
    affinity_teardown
    end_story
  fi
  if wanted seed; then
    begin_story seed
    st seed-scheduled step_seed_scheduled
    st seed-image step_seed_image
    st seed-resize step_seed_resize
    st seed-restart step_seed_restart
    st seed-enforce step_seed_enforce
    st seed-no-affinity step_seed_no_affinity
    st seed-rolling step_seed_rolling
    seed_teardown
    end_story
  fi
  if wanted nri; then
    begin_story nri
    st nri-daemonset step_nri_daemonset
    st nri-admission step_nri_admission
    st nri-recreate-refused step_nri_recreate_refused
    nri_teardown
    end_story
  fi
  if wanted hold; then
    begin_story hold
    st hold step_hold
    end_story
  fi
  begin_story cleanup
  st cleanup step_cleanup
  end_story
}

main() {
  choose_stories "$(cat "${results}/k8s/steps" 2> /dev/null || true)" || { STEPS=(node); fail_rest "setup: bad STEPS"; return 1; }
  list_steps
  # host-clean is the host's to record, after the guest.
  local s guest_steps=()
  for s in "${STEPS[@]}"; do [ "${s}" = host-clean ] || guest_steps+=("${s}"); done
  STEPS=("${guest_steps[@]}")
  say "stories: ${wanted_stories}"
  say "kernel $(uname -r), $(nproc) CPUs, NUMA nodes $(cat /sys/devices/system/node/online)"
  uname -r -v > "${results}/kernel.txt"
  mkdir -p "${run}/bin" "${kubelet_root}"
  # containerd from the workspace (the host's KT_K8S_CONTAINERD_BIN), else Debian's.
  containerd_bin=$(cat "${results}/k8s/containerd-bin" 2> /dev/null || true)
  if [ -n "${containerd_bin}" ]; then
    containerd_bin=${ws}/${containerd_bin}
    export PATH="${containerd_bin}:${PATH}"
  fi
  if ! setup_mounts; then fail_rest "setup: mounting cgroup2, devpts, shm failed"; return 1; fi
  if ! setup_network; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_vfio; then fail_rest "setup: ${setup_error}"; return 1; fi
  "${bin}/kata-topo" topology --json > "${results}/topology.json" 2> /dev/null || true
  if ! setup_containerd; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_kubelet; then fail_rest "setup: ${setup_error}"; return 1; fi
  if ! setup_device_plugin; then fail_rest "setup: ${setup_error}"; return 1; fi
  begin_story node
  st node step_node
  st pod-network step_pod_network
  end_story
  run_stories
  node_json
  fail_rest "the step ended without recording a result"
  for p in "${plugin_pid}" "${kubelet_pid}" "${containerd_pid}"; do
    if [ -n "${p}" ]; then kill "${p}" 2> /dev/null || true; fi
  done
  ! grep -q '"pass":false' "${results}/steps.jsonl"
}

case "${1:-}" in
  --scenario) main ;;
  # Sourced by another scenario's guest.sh (make k8s-record) for the node's set-up.
  --functions) ;;
  *)
    echo "guest.sh runs as PID 1 of the k8s-test guest (make k8s-test); --list-steps lists its steps" >&2
    exit 2
    ;;
esac
