#!/usr/bin/env bash
# The host's side of make k8s-test, sourced by integration/vm-test/run.sh k8s-test: etcd and
# kube-apiserver run here, natively, and the guest (the node: kubelet, containerd, the wrapper,
# the device plugin) reaches the API server through one forwarded port.
#
# kube-scheduler and kube-controller-manager run beside them: every pod of the steps is placed by
# the scheduler (a nodeSelector, never spec.nodeName), the DaemonSet controller runs the
# installer's pods, the garbage collector deletes a deleted DaemonSet's pods, and the
# ServiceAccount admission plugin with the token controller gives a pod its API credentials.
#
# Why the control plane is on the host: under TCG every instruction of the guest is emulated,
# and kube-apiserver with etcd is the heaviest thing in the cluster while being no part of what
# kata-topo checks; on the host they serve in about a second and leave the guest's two emulated
# CPUs to the kubelet, containerd and the pods. The guest's network stays closed
# (`restrict=on`): its second NIC (virtio-net) reaches nothing but 10.0.2.100:6443, which QEMU
# forwards to the API server on this host's loopback.
#
# Needs KT_K8S_BIN (the directory of make k8s's binaries). KT_K8S_CONTAINERD_BIN, a directory
# of the workspace with containerd, ctr, containerd-shim-runc-v2 and runc, runs the guest's
# containerd from there (containerd 2.x, configuration version 3) instead of Debian's. Writes the cluster's credentials
# under target/k8s-test/pki (removed at the end) and the guest's under target/k8s-test/guest/k8s.
# shellcheck disable=SC2034,SC2154 # the scenario_* variables, out, say and die are run.sh's
set -euo pipefail

k8s_bin=${KT_K8S_BIN:-}
containerd_bin=""
if [ -n "${KT_K8S_CONTAINERD_BIN:-}" ]; then
  containerd_bin=$(realpath -e "${KT_K8S_CONTAINERD_BIN}") || die "KT_K8S_CONTAINERD_BIN: no ${KT_K8S_CONTAINERD_BIN}"
  case "${containerd_bin}" in
    "${workspace}"/*) containerd_bin=${containerd_bin#"${workspace}"/} ;;
    *) die "KT_K8S_CONTAINERD_BIN must be inside the workspace (the guest sees only that): ${containerd_bin}" ;;
  esac
  [ -x "${workspace}/${containerd_bin}/containerd" ] || die "no containerd in ${KT_K8S_CONTAINERD_BIN}"
fi
if [ -z "${k8s_bin}" ] || [ ! -x "${k8s_bin}/kube-apiserver" ]; then
  die "KT_K8S_BIN names no directory with make k8s's binaries (make k8s-test sets it)"
fi
for tool in openssl busybox; do
  command -v "${tool}" > /dev/null || die "${tool} is missing (make deps installs it)"
done

# The guest: 1.5 GiB per NUMA node (the kubelet, containerd and the pods), make k8s's
# binaries read-only on /opt/k8s.
scenario_memory_mib=1536
scenario_shares=("k8s:${k8s_bin}:ro")
scenario_not_covered="Kata itself: the delegate is runc (no Kata guest boots here; make kata-test runs Kata's shim and agent), so the VM view's rules are not exercised (integration/tests/vm.rs covers them against a real QEMU); the control plane runs on the host, not in a node; node B (on the host) joins after the installer's story, so the installer's rollout is watched on node A alone; no pod network across the nodes, no kube-proxy or Services; the kubectl plugin (the kubelets serve no port for kubectl exec)"

pki=${out}/pki
control=${out}/control
etcd_pid=""
apiserver_pid=""
scheduler_pid=""
controllers_pid=""
api_port=""
# Where the API server listens: the host's loopback at a free port; when node B runs, the
# address the guest reaches it at, 10.0.2.100:6443, held on the host's lo for the run — a pod
# on either node (the installer's, with the host's network) then finds the API server at the
# same address.
api_addr=127.0.0.1
api_addr_held=""

free_port() { # a TCP port nothing on this host's loopback listens on
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<> "/dev/tcp/127.0.0.1/${p}") 2> /dev/null; then
      echo "${p}"
      return 0
    fi
  done
  return 1
}

stop_pid() { # PID
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2> /dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
}

scenario_down() {
  stop_node_b
  release_api_addr
  stop_pid "${scheduler_pid}"
  scheduler_pid=""
  stop_pid "${controllers_pid}"
  controllers_pid=""
  stop_pid "${apiserver_pid}"
  apiserver_pid=""
  stop_pid "${etcd_pid}"
  etcd_pid=""
  rm -rf "${pki}" "${control}/etcd"
}

kubeconfig() { # SERVER TOKEN CA -> a kubeconfig on stdout
  cat << EOF
apiVersion: v1
kind: Config
clusters:
- name: kata-topo-test
  cluster:
    server: $1
    certificate-authority-data: $(base64 -w0 < "$3")
users:
- name: user
  user:
    token: $2
contexts:
- name: kata-topo-test
  context: {cluster: kata-topo-test, user: user}
current-context: kata-topo-test
EOF
}

scenario_up() {
  local started_up
  started_up=$(date +%s)
  rm -rf "${pki}" "${control}"
  mkdir -p "${pki}" "${control}" "${out}/guest/k8s"
  : > "${out}/guest/k8s/nodes.json"
  : > "${out}/guest/stories.jsonl"
  printf '%s\n' "${KT_K8S_STEPS:-}" > "${out}/guest/k8s/steps"
  chmod 0700 "${pki}"
  # A CA of this run only, the API server's certificate for the host's loopback and the
  # guest's forwarded address, the service-account keys, and two tokens: the operator
  # (system:masters) and the node (system:node:kata-topo-vm in system:nodes, so the Node
  # authorizer and RBAC give the kubelet exactly a node's rights).
  (
    cd "${pki}"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj /CN=kata-topo-test-ca
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver
    printf 'subjectAltName=IP:127.0.0.1,IP:10.0.2.100,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default\n' > san
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt \
      -days 2 -extfile san
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) > "${control}/openssl.log" 2>&1 || die "making the test cluster's certificates failed: $(tail -n 3 "${control}/openssl.log")"
  local admin_token node_token node_b_token
  admin_token=$(openssl rand -hex 16)
  node_token=$(openssl rand -hex 16)
  node_b_token=$(openssl rand -hex 16)
  printf '%s,admin,admin,system:masters\n%s,system:node:kata-topo-vm,node-kata-topo-vm,system:nodes\n%s,system:node:kata-topo-b,node-kata-topo-b,system:nodes\n' \
    "${admin_token}" "${node_token}" "${node_b_token}" > "${pki}/tokens.csv"

  local etcd_port peer_port want_b=""
  grep -qx node-b <<< "$(KT_K8S_STEPS=${KT_K8S_STEPS:-} bash "${workspace}/integration/k8s-test/guest.sh" --list-steps)" && want_b=1
  if ! { etcd_port=$(free_port) && peer_port=$(free_port); }; then
    die "no free port on the loopback"
  fi
  if [ -n "${want_b}" ]; then
    lock_node_b
    hold_api_addr
  else
    api_port=$(free_port) || die "no free port on the loopback"
  fi
  setpriv --pdeathsig KILL "${k8s_bin}/etcd" --data-dir "${control}/etcd" \
    --listen-client-url "http://127.0.0.1:${etcd_port}" --listen-peer-url "http://127.0.0.1:${peer_port}" \
    < /dev/null > "${control}/etcd.log" 2>&1 &
  etcd_pid=$!
  # Privileged containers allowed, as kubeadm's clusters do: the installer's DaemonSet is one.
  setpriv --pdeathsig KILL "${k8s_bin}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${etcd_port}" \
    --bind-address "${api_addr}" --secure-port "${api_port}" --advertise-address 10.0.2.100 \
    --tls-cert-file "${pki}/apiserver.crt" --tls-private-key-file "${pki}/apiserver.key" \
    --client-ca-file "${pki}/ca.crt" --token-auth-file "${pki}/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "${pki}/sa.pub" --service-account-signing-key-file "${pki}/sa.key" \
    --service-cluster-ip-range 10.96.0.0/24 --profiling=false --allow-privileged=true \
    < /dev/null > "${control}/kube-apiserver.log" 2>&1 &
  apiserver_pid=$!
  kubeconfig "https://${api_addr}:${api_port}" "${admin_token}" "${pki}/ca.crt" > "${control}/admin.kubeconfig"
  local ready=""
  for _ in $(seq 1 600); do
    kill -0 "${apiserver_pid}" 2> /dev/null || break
    if "${k8s_bin}/kubectl" --kubeconfig "${control}/admin.kubeconfig" get --raw /readyz > /dev/null 2>&1; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ -n "${ready}" ] || die "kube-apiserver did not become ready: $(tail -n 5 "${control}/kube-apiserver.log")"
  # The scheduler and the controllers, as the operator (a test cluster's shortcut: kubeadm gives
  # each its own identity). No serving port: nothing here scrapes them. The controllers are
  # upstream's default set (--controllers=*); the service-account token controller signs with
  # the API server's key, and kube-root-ca.crt is published from this run's CA.
  setpriv --pdeathsig KILL "${k8s_bin}/kube-controller-manager" \
    --kubeconfig "${control}/admin.kubeconfig" --controllers '*' --leader-elect=false \
    --service-account-private-key-file "${pki}/sa.key" --root-ca-file "${pki}/ca.crt" \
    --use-service-account-credentials=false --secure-port 0 --profiling=false \
    < /dev/null > "${control}/kube-controller-manager.log" 2>&1 &
  controllers_pid=$!
  setpriv --pdeathsig KILL "${k8s_bin}/kube-scheduler" \
    --kubeconfig "${control}/admin.kubeconfig" --leader-elect=false --secure-port 0 --profiling=false \
    < /dev/null > "${control}/kube-scheduler.log" 2>&1 &
  scheduler_pid=$!
  # A pod is admitted only once its namespace's ServiceAccount exists (the controllers create
  # it), and an installer pod's token volume needs kube-root-ca.crt.
  ready=""
  for _ in $(seq 1 600); do
    kill -0 "${controllers_pid}" 2> /dev/null || break
    kill -0 "${scheduler_pid}" 2> /dev/null || break
    if "${k8s_bin}/kubectl" --kubeconfig "${control}/admin.kubeconfig" get serviceaccount default > /dev/null 2>&1 \
      && "${k8s_bin}/kubectl" --kubeconfig "${control}/admin.kubeconfig" -n kube-system get configmap kube-root-ca.crt > /dev/null 2>&1; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ -n "${ready}" ] || die "the controllers or the scheduler did not come up: $(tail -n 3 "${control}/kube-controller-manager.log") $(tail -n 3 "${control}/kube-scheduler.log")"
  # The guest's view: the same cluster at the forwarded address.
  kubeconfig https://10.0.2.100:6443 "${admin_token}" "${pki}/ca.crt" > "${out}/guest/k8s/admin.kubeconfig"
  kubeconfig https://10.0.2.100:6443 "${node_token}" "${pki}/ca.crt" > "${out}/guest/k8s/kubelet.kubeconfig"
  cp "${pki}/ca.crt" "${out}/guest/k8s/ca.crt"
  (umask 077 && kubeconfig "https://${api_addr}:${api_port}" "${node_b_token}" "${pki}/ca.crt" > "${pki}/node-b.kubeconfig")
  printf '%s\n' "${containerd_bin}" > "${out}/guest/k8s/containerd-bin"
  # The installer's image in two versions (integration/k8s-test/steps-installer.sh upgrades
  # from the first to the second): the workspace's version, and the same build stamped -next.
  local version v
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "${workspace}/Cargo.toml" | head -n 1)
  : > "${out}/guest/k8s/installer-versions"
  for v in "${version}" "${version}-next"; do
    bash "${workspace}/integration/images/build.sh" --installer "${v}" "${workspace}/target/debug" \
      "${workspace}/target/kata-topo-images" > /dev/null \
      || die "building the installer's image ${v} failed"
    echo "${v}" >> "${out}/guest/k8s/installer-versions"
  done
  # Node B only for the stories that use it (it imports the installer's images just built).
  if [ -n "${want_b}" ]; then
    start_node_b
  else
    mkdir -p "${out}/guest/node-b"
    echo "not started" > "${out}/guest/node-b/status"
  fi
  "${k8s_bin}/etcd" --version > "${out}/guest/k8s/etcd.version" 2>&1 || true
  local b
  for b in kube-apiserver kube-scheduler kube-controller-manager; do
    "${k8s_bin}/${b}" --version > "${out}/guest/k8s/${b}.version" 2>&1 || true
  done
  say "etcd, kube-apiserver, kube-scheduler and kube-controller-manager up on the host's loopback in $(($(date +%s) - started_up)) s"
  # QEMU, restricted: each guest connection to 10.0.2.100:6443 runs one relay to the API server.
  scenario_qemu_args=(
    -netdev "user,id=api,restrict=on,guestfwd=tcp:10.0.2.100:6443-cmd:busybox nc ${api_addr} ${api_port}"
    -device "virtio-net-pci,netdev=api,bus=pcie.0"
  )
}

# Node B (node-b.sh): its data under target/k8s-test/node-b, what the guest reads of it (logs,
# the wrapper's state) and its request files under guest/node-b.
node_b_pid=""
node_b_lock=""
node_b_env() {
  env NODE_B_DIR="${out}/node-b" NODE_B_SHARE="${out}/guest/node-b" KT_K8S_BIN="${k8s_bin}" \
    WORKSPACE="${workspace}" NODE_B_KUBECONFIG="${pki}/node-b.kubeconfig" "$@"
}
# Node B's name, address, bridge and cgroup root, and the API address 10.0.2.100:6443, are this
# host's: one run at a time holds them (make k8s-test and make k8s-up included), the lock held
# until this script exits.
lock_node_b() {
  exec {node_b_lock}> /run/lock/kata-topo-node-b.lock
  flock -n "${node_b_lock}" || die "another make k8s-test or make k8s-up runs node B on this host (make k8s-down ends the latter)"
}
hold_api_addr() {
  # A run killed before its teardown left the address (the lock says no run holds it now).
  ip addr del 10.0.2.100/32 dev lo 2> /dev/null || true
  ip addr add 10.0.2.100/32 dev lo || die "cannot add 10.0.2.100/32 to lo for the API server"
  api_addr_held=1
  api_addr=10.0.2.100
  api_port=6443
}
release_api_addr() {
  [ -n "${api_addr_held}" ] || return 0
  ip addr del 10.0.2.100/32 dev lo 2> /dev/null || true
  api_addr_held=""
}
start_node_b() {
  local script=${workspace}/integration/k8s-test/node-b.sh
  node_b_env bash "${script}" clean > /dev/null 2>&1 || true
  rm -rf "${out}/guest/node-b"
  mkdir -p "${out}/guest/node-b"
  node_b_env bash "${script}" save || die "node B: cannot read the kernel settings it would change"
  node_b_env setpriv --pdeathsig KILL unshare --mount --propagation private --pid --fork --kill-child=KILL \
    --mount-proc bash "${script}" run < /dev/null > "${out}/guest/node-b/run.log" 2>&1 &
  node_b_pid=$!
  local s=""
  for _ in $(seq 1 240); do
    s=$(cat "${out}/guest/node-b/status" 2> /dev/null || true)
    [ -z "${s}" ] || break
    kill -0 "${node_b_pid}" 2> /dev/null || break
    sleep 0.5
  done
  # A node B that did not come up fails its story in the guest (the node-b step), not the run.
  say "node B (kata-topo-b, on this host): ${s:-did not start}$( [ "${s}" = containerd ] || echo ": $(tail -n 3 "${out}/guest/node-b/run.log" "${out}/guest/node-b/node-b.log" 2> /dev/null | paste -sd ' ')")"
}
node_b_left=""
stop_node_b() {
  [ -n "${node_b_pid}" ] || return 0
  stop_pid "${node_b_pid}"
  node_b_pid=""
  node_b_left=$(node_b_env bash "${workspace}/integration/k8s-test/node-b.sh" clean 2>&1 || true)
}

# After the guest: node B stopped and removed; the host-clean step (when the steps include it)
# says what was left on this host.
scenario_finish() {
  grep -qx host-clean <<< "$(KT_K8S_STEPS=${KT_K8S_STEPS:-} bash "${workspace}/integration/k8s-test/guest.sh" --list-steps)" || { stop_node_b; return 0; }
  local before="" procs
  before=$(cat "${out}/guest/node-b/leftovers" 2> /dev/null || true)
  stop_node_b
  release_api_addr
  if ip -br addr show dev lo | grep -qw 10.0.2.100/32; then node_b_left="${node_b_left}address 10.0.2.100 on lo; "; fi
  procs=$({ grep -l "kata-topo-b" /proc/[0-9]*/cgroup 2> /dev/null || true; } | wc -l)
  local detail="node B stopped: its namespace's processes killed, then node-b.sh clean: ${node_b_left:-nothing left}; processes in its cgroups after: ${procs}; the guest's last leftovers check on node B: ${before:-nothing}"
  [ "$(cat "${out}/guest/node-b/status" 2> /dev/null)" != "not started" ] || detail="node B not started (no story of this run uses it); processes in its cgroups: ${procs}"
  local pass=false
  [ -z "${node_b_left}" ] && [ "${procs}" = 0 ] && pass=true
  jq -cn --argjson pass "${pass}" --arg detail "${detail}" \
    '{name: "host-clean", pass: $pass, rules: [], detail: $detail}' >> "${out}/guest/steps.jsonl"
}

scenario_report() {
  local v
  jq -n \
    --arg kubelet "$(cat "${out}/guest/k8s/kubelet.version" 2> /dev/null || echo unknown)" \
    --arg kubectl "$(cat "${out}/guest/k8s/kubectl.version" 2> /dev/null || echo unknown)" \
    --arg apiserver "$(cat "${out}/guest/k8s/kube-apiserver.version" 2> /dev/null || echo unknown)" \
    --arg scheduler "$(cat "${out}/guest/k8s/kube-scheduler.version" 2> /dev/null || echo unknown)" \
    --arg controllers "$(cat "${out}/guest/k8s/kube-controller-manager.version" 2> /dev/null || echo unknown)" \
    --arg cni "$(cat "${out}/guest/k8s/cni.version" 2> /dev/null || echo unknown)" \
    --slurpfile nodes "${out}/guest/k8s/nodes.json" \
    --arg node_b_containerd "$(cat "${out}/guest/node-b/containerd.version" 2> /dev/null || echo unknown)" \
    --arg node_b_kubelet "$(cat "${out}/guest/node-b/kubelet.version" 2> /dev/null || echo "not started")" \
    --arg stories "${KT_K8S_STEPS:-all}" \
    --slurpfile story_times "${out}/guest/stories.jsonl" \
    --arg etcd "$(v=$(cat "${out}/guest/k8s/etcd.version" 2> /dev/null) && echo "${v}" || echo unknown)" \
    --arg containerd "$(cat "${out}/guest/containerd.version" 2> /dev/null || echo unknown)" \
    '{versions: {kubelet: $kubelet, kubectl: $kubectl, "kube-apiserver": $apiserver, "kube-scheduler": $scheduler, "kube-controller-manager": $controllers, etcd: $etcd, containerd: $containerd, cni: $cni, "node-b kubelet": $node_b_kubelet, "node-b containerd": $node_b_containerd}, nodes: ($nodes[0] // null), stories: $stories, story_seconds: $story_times}'
}
