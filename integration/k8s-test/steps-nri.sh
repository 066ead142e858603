#!/usr/bin/env bash
# k8s-test's NRI story, sourced by guest.sh: the seed's fault caught by kata-topo-nri instead of
# the wrapper. containerd 2.x only (NRI on in the guest's configuration version 3; 1.6 has no
# NRI). The plugin is the shipped DaemonSet (deploy/nri/), applied with kubectl -k through an
# overlay written here as an operator would: the installer's image at the run's tag, the
# ConfigMap's file with this node's timings, and node affinity on (the kubelet's kubeconfig
# mounted, what docs/nri.md says an overlay adds); the DaemonSet's securityContext, seccomp
# profile, read-only root and mounts as shipped. The DaemonSet controller runs its pod on both
# nodes: on node A it registers with containerd; on node B (containerd 1.6, no NRI) it keeps
# running, waiting for NRI's socket. The pod is on the default runc handler (no RuntimeClass,
# no wrapper), in enforce mode, requiring a label the operator then changes; the kubelet's
# in-place image change is refused by the plugin before runc sees it, and kubectl shows
# kata-topo's message.
# shellcheck disable=SC2154,SC2034 # the node, kubectl and the paths are guest.sh's and guest-lib.sh's
set -euo pipefail

NRI_STEPS=(nri-daemonset nri-admission nri-recreate-refused)

nri_pod=""
nri_mark=0
nri_b_mark=0
nri_dir=""
# What the DaemonSet's configuration names: the same paths as the wrapper's here (the guest's
# state_dir and log_file are the shipped ones), read back from the file applied.
nri_state=/run/kata-topo
nri_log=/var/log/kata-topo.log
nri_metrics=/var/lib/prometheus/node-exporter
declare -A nri_ds_pods=()

# grep without -q: see logged_since (guest.sh).
nri_logged() { tail -n "+$((nri_mark + 1))" "${nri_log}" 2> /dev/null | grep -F -- "$1" > /dev/null; }
# The nri-* events of the plugin's log FILE since line MARK, in order.
nri_events() { tail -n "+$(($2 + 1))" "$1" 2> /dev/null | jq -R -r 'fromjson? | select(.event // "" | startswith("nri-")) | .event' | paste -sd ' ' -; }

# The overlay of deploy/nri/ in ${nri_dir} for installer image VERSION. The ConfigMap's file is
# the shipped one with this node's timings: under TCG the emulated kubelet answers in hundreds
# of milliseconds (kubelet_timeout_ms 2000, as the wrapper's here) and a check reading the
# kubelet and the API server takes seconds, so nri_answer_ms is 4000, half of the 8 s
# plugin_request_timeout of the guest's containerd (the shipped 200 ms is a real node's).
# Node affinity needs the node's credentials: the kubelet's kubeconfig (a token: no key
# directory to mount) read-only at its node path, with kubeconfig naming it and the guest's
# api_timeout_ms (TLS through QEMU's relay). node_name stays unset: the pod shares the node's
# host name (hostNetwork), which is the node's name here.
nri_overlay() { # VERSION
  local base
  base=$(realpath -m --relative-to="${nri_dir}" "${ws}/deploy/nri")
  { echo "# deploy/nri/configuration-kata-topo.toml at k8s-test's emulated node's timings, node affinity on."
    sed -e 's/^kubelet_timeout_ms = .*/kubelet_timeout_ms = 2000/' \
      -e 's/^nri_answer_ms = .*/nri_answer_ms = 4000/' \
      -e "s|^kubeconfig = .*|kubeconfig = \"${run}/kubelet.kubeconfig\"\napi_timeout_ms = ${api_timeout_ms}|" \
      "${ws}/deploy/nri/configuration-kata-topo.toml"
  } > "${nri_dir}/configuration-kata-topo.toml" || return 1
  local want
  for want in 'kubelet_timeout_ms = 2000' 'nri_answer_ms = 4000' "kubeconfig = \"${run}/kubelet.kubeconfig\""; do
    grep -qxF -- "${want}" "${nri_dir}/configuration-kata-topo.toml" || { echo "the shipped configuration has no line to set ${want}"; return 1; }
  done
  cat > "${nri_dir}/kustomization.yaml" << EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ${base}
images:
  - name: localhost/kata-topo/installer
    newTag: "$1"
configMapGenerator:
  - name: kata-topo-nri-config
    namespace: kube-system
    behavior: replace
    files: [configuration-kata-topo.toml]
patches:
  - target: {kind: DaemonSet, name: kata-topo-nri}
    patch: |
      - op: add
        path: /spec/template/spec/volumes/-
        value: {name: kubeconfig, hostPath: {path: ${run}/kubelet.kubeconfig, type: File}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {name: kubeconfig, mountPath: ${run}/kubelet.kubeconfig, readOnly: true}
EOF
}

# Node B's plugin said it waits for NRI's socket.
nri_b_waits() { tail -n "+$((nri_b_mark + 1))" "${node_b_share}/var-log/kata-topo.log" 2> /dev/null | grep -F '"event":"nri-unavailable"' > /dev/null; }
nri_has_image() { ctr -a "${sock}" -n k8s.io images ls -q 2> /dev/null | grep -qxF -- "$1"; }
# The DaemonSet's pod on NODE, running (its container started); prints its name.
nri_ds_running() { # NODE
  local p
  p=$(inst_ds_pod_now "$1" kata-topo-nri) && inst_pod_running "${p}" && echo "${p}"
}
nri_ds_gone() { ! k -n kube-system get pods -o json | jq -e 'any(.items[]; any(.metadata.ownerReferences[]?; .kind == "DaemonSet" and .name == "kata-topo-nri"))' > /dev/null; }
nri_pod_state() { # POD: phase, restarts, the container's state
  k -n kube-system get pod "$1" -o jsonpath='{.status.phase} restarts {.status.containerStatuses[0].restartCount}, image {.status.containerStatuses[0].image}, {.status.containerStatuses[0].state}' 2>&1 | cut -c 1-300
}
# The container's own output (the kubelet serves no logs here: its file on NODE).
nri_pod_output() { # POD NODE
  cat "$(inst_log_root "$2")"/pods/kube-system_"$1"_*/nri/*.log 2> /dev/null | sed 's/^[^ ]* [^ ]* [^ ]* //' | tail -n 2 | cut -c 1-200 | paste -sd ' ' -
}

step_nri_daemonset() {
  if [ -z "${containerd_bin}" ]; then
    record nri-daemonset false "" "containerd $(cat "${results}/containerd.version" 2> /dev/null) has no NRI: the story runs on the containerd 2.3.4 leg"
    return 1
  fi
  # The installer's image of this run (its first version, the workspace's): imported by the
  # installer's story on this node already in a full run; imported here when the story runs
  # alone. Node B imported it when it came up.
  local v image import="already on node A" t0
  v=$(sed -n 1p "${results}/k8s/installer-versions" 2> /dev/null)
  [ -n "${v}" ] || { record nri-daemonset false "" "no installer image built for this run (k8s/installer-versions)"; return 1; }
  image=localhost/kata-topo/installer:${v}
  if ! nri_has_image "${image}"; then
    t0=$(date +%s)
    ctr -a "${sock}" -n k8s.io images import "${ws}/target/kata-topo-images/installer-${v}.tar" > /dev/null \
      || { record nri-daemonset false "" "ctr images import installer-${v}.tar failed"; return 1; }
    import="imported on node A in $(($(date +%s) - t0)) s"
  fi
  nri_dir=$(mktemp -d "${run}/nri-deploy.XXXXXX")
  local why
  why=$(nri_overlay "${v}") || { record nri-daemonset false "" "the overlay: ${why}"; return 1; }
  # Where the plugin keeps its state and writes its log: what the file applied names.
  nri_state=$(sed -n 's/^state_dir = "\(.*\)"$/\1/p' "${nri_dir}/configuration-kata-topo.toml")
  nri_log=$(sed -n 's/^log_file = "\(.*\)"$/\1/p' "${nri_dir}/configuration-kata-topo.toml")
  nri_metrics=$(sed -n 's/^metrics_dir = "\(.*\)"$/\1/p' "${nri_dir}/configuration-kata-topo.toml")
  rm -rf "${results}/nri-overlay"
  cp -r "${nri_dir}" "${results}/nri-overlay" 2> /dev/null || true
  nri_mark=$(wc -l 2> /dev/null < "${nri_log}" || echo 0)
  nri_b_mark=$(wc -l 2> /dev/null < "${node_b_share}/var-log/kata-topo.log" || echo 0)
  k_kustomize apply -k "${nri_dir}" -o name > "${nri_dir}/applied" 2> "${run}/apply" \
    || { record nri-daemonset false "" "kubectl apply -k failed: $(tail -n 3 "${run}/apply")"; return 1; }
  poll 300 nri_ds_running "${node}" > /dev/null || true
  nri_ds_pods[${node}]=$(inst_ds_pod_now "${node}" kata-topo-nri || true)
  poll 120 nri_logged '"event":"nri-synchronized"' || true
  k -n kube-system get daemonset kata-topo-nri -o yaml > "${results}/nri-daemonset.yaml" 2>&1 || true
  local a=${nri_ds_pods[${node}]:-} detail ok=1
  detail="kubectl apply -k (deploy/nri with an overlay: image ${image}, ${import}; the ConfigMap's file with kubelet_timeout_ms 2000, nri_answer_ms 4000, kubeconfig ${run}/kubelet.kubeconfig mounted read-only): $(paste -sd ' ' "${nri_dir}/applied"); node A: pod ${a:-none} $( [ -n "${a}" ] && nri_pod_state "${a}"), its log (${nri_log}): $(nri_events "${nri_log}" "${nri_mark}"); containerd: $(grep -a 'kata-topo' "${results}/containerd.log" | grep -a -i 'plugin' | tail -n 1 | cut -c 1-300)"
  { [ -n "${a}" ] && inst_pod_running "${a}" && nri_logged '"event":"nri-registered"' && nri_logged '"event":"nri-synchronized"'; } || ok=""
  # Node B (when it joined): containerd 1.6 has no NRI. Its pod runs and waits for the socket
  # (nri-unavailable, said once, then a retry every 500 ms); only a pod that is not running or
  # has restarted (a crash loop) fails the step.
  if k get node "${node_b}" > /dev/null 2>&1; then
    local b b_log=${node_b_share}/var-log/kata-topo.log
    poll 120 nri_ds_running "${node_b}" > /dev/null || true
    b=$(inst_ds_pod_now "${node_b}" kata-topo-nri || true)
    nri_ds_pods[${node_b}]=${b}
    poll 60 nri_b_waits || true
    detail="${detail}; node B ($(cat "${node_b_share}/containerd.version" 2> /dev/null)): pod ${b:-none} $( [ -n "${b}" ] && nri_pod_state "${b}"), its log: $(nri_events "${b_log}" "${nri_b_mark}"), $(tail -n "+$((nri_b_mark + 1))" "${b_log}" 2> /dev/null | jq -R -r 'fromjson? | select(.event == "nri-unavailable") | .error' | tail -n 1)"
    { [ -n "${b}" ] && inst_pod_running "${b}" \
      && [ "$(k -n kube-system get pod "${b}" -o jsonpath='{.status.containerStatuses[0].restartCount}')" = 0 ] \
      && nri_b_waits; } || ok=""
  else
    detail="${detail}; node B did not join this run: no second pod"
  fi
  if [ -n "${ok}" ]; then
    record nri-daemonset true "" "$(cut -c 1-1800 <<< "${detail}")"
  else
    record nri-daemonset false "" "expected the DaemonSet's pod on node A registered and synchronised, node B's running and waiting for NRI's socket: $(cut -c 1-1800 <<< "${detail}") $( [ -n "${a}" ] && nri_pod_output "${a}" "${node}")"
  fi
}

# A Deployment of one pod on the runc handler requiring example.com/accelerator In [nic-a].
nri_deploy() {
  k apply -f - > /dev/null << EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: kt-nri}
spec:
  replicas: 1
  selector: {matchLabels: {app: kt-nri}}
  template:
    metadata:
      labels: {app: kt-nri}
      annotations: {kata-topo.io/mode: enforce}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {key: ${seed_label}, operator: In, values: [nic-a]}
      containers:
        - name: app
          image: localhost/kata-topo/busybox:1
          imagePullPolicy: Never
          command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
          resources:
            requests: {cpu: "0", memory: 64Mi}
            limits: {cpu: 200m, memory: 128Mi}
EOF
}

# The plugin's verdicts for pod NAME in its state_dir (on this node the wrapper's too).
nri_status() { "${bin}/kata-topo" status --state-dir "${nri_state}" --json 2> /dev/null || true; }
nri_verdicts() {
  nri_status 2> /dev/null \
    | jq -c --arg p "$1" '[.sandboxes[].verdicts[] | .[1] | select(.pod.name == $p) | {operation, decision, findings: [.findings[].rule]}]'
}
# The rules of the findings the plugin logged after line MARK of its log_file matching FILTER
# (rules_since of guest-lib.sh, on the plugin's log).
nri_rules_since() { # MARK FILTER
  tail -n "+$(($1 + 1))" "${nri_log}" 2> /dev/null \
    | jq -R -r "fromjson? | select(.event == \"finding\") | select($2) | .rule" \
    | sort -u | paste -sd ' ' -
}
# The sandbox the plugin's state names for pod NAME.
nri_sandbox_of() { nri_status | jq -r --arg p "$1" '[.sandboxes[] | select(any(.verdicts[]; .[1].pod.name == $p)) | .sandbox_id] | last // empty'; }
# The container's verdict: the create's, or the CPU manager's push right after it (the state
# keeps each task's latest).
nri_has_create() { jq -e 'any(.[]; .operation == "create" or .operation == "update")' <<< "$(nri_verdicts "$1")" > /dev/null 2>&1; }

step_nri_admission() {
  local sched handler v
  k label node "${node}" "${seed_label}=nic-a" --overwrite > /dev/null \
    || { record nri-admission false "" "cannot label ${node}"; return 1; }
  nri_deploy || { record nri-admission false "" "cannot create Deployment kt-nri"; return 1; }
  poll 240 pod_of_ready kt-nri || true
  nri_pod=$(seed_pod_of kt-nri || true)
  [ -n "${nri_pod}" ] || { record nri-admission false "" "no pod of kt-nri: $(k get pods -o wide 2>&1 | tail -n 3 | paste -sd ';')"; return 1; }
  poll 30 nri_has_create "${nri_pod}" || true
  v=$(nri_verdicts "${nri_pod}")
  sched=$(scheduled_event "${nri_pod}")
  handler=$(k get pod "${nri_pod}" -o jsonpath='{.spec.runtimeClassName}')
  local detail
  detail="Deployment kt-nri (no RuntimeClass: the runc handler; kata-topo.io/mode: enforce; requires ${seed_label} In [nic-a]): pod ${nri_pod} ready $(k get pod "${nri_pod}" -o jsonpath='{.status.containerStatuses[0].ready}'), RuntimeClass '${handler}'; Scheduled: ${sched:-none}; the plugin's verdicts: ${v:-none}"
  if ready "${nri_pod}" && [ -z "${handler}" ] && grep -q "to ${node}\$" <<< "${sched}" \
    && jq -e 'any(.[]; .operation == "create" or .operation == "update") and all(.[]; (.findings | length) == 0)' <<< "${v:-null}" > /dev/null; then
    record nri-admission true "" "${detail}"
  else
    record nri-admission false "" "expected the pod admitted and checked clean by the plugin: ${detail}"
  fi
}

step_nri_recreate_refused() {
  local mark describe rules
  mark=$(wc -l 2> /dev/null < "${nri_log}" || echo 0)
  k label node "${node}" "${seed_label}=nic-b" --overwrite > /dev/null \
    || { record nri-recreate-refused false "" "cannot relabel ${node}"; return 1; }
  k set image "pod/${nri_pod}" app=localhost/kata-topo/busybox:2 > /dev/null \
    || { record nri-recreate-refused false "" "kubectl set image pod/${nri_pod} failed"; return 1; }
  poll 180 pod_field_has "${nri_pod}" '{.status.containerStatuses[0].state.waiting.message}' node-affinity-violated || true
  describe=$(k describe pod "${nri_pod}" 2>&1 || true)
  printf '%s\n' "${describe}" > "${results}/describe-kt-nri.txt"
  rules=$(nri_rules_since "${mark}" '.pod_name == "'"${nri_pod}"'" and .operation == "recreate" and .decision == "reject"')
  local detail
  detail="kubectl label node ${node} ${seed_label}=nic-b --overwrite; kubectl set image pod/${nri_pod} app=localhost/kata-topo/busybox:2; kubectl describe pod: $(grep -E -A2 '^ +State: +Waiting' <<< "${describe}" | sed 's/^ *//' | paste -sd ' ' | cut -c 1-700)"
  if [ "${rules}" = node-affinity-violated ] && grep -q 'kata-topo refused the recreate' <<< "${describe}" \
    && grep -q 'node-affinity-violated' <<< "${describe}" && ! ready "${nri_pod}"; then
    record nri-recreate-refused true "${rules}" "${detail}"
  else
    record nri-recreate-refused false "${rules}" "expected the plugin to refuse the recreate, kata-topo's message in the waiting state: ${detail}"
  fi
}

# The Deployment goes first, and the plugin, still connected, clears its pod's state and
# metrics when containerd removes the sandbox; then the label, and the DaemonSet and its
# ConfigMap (what apply -k made), its pods gone on both nodes before the next story: the
# plugin's SIGTERM closes its connection, containerd goes on without it.
nri_teardown() {
  local sb
  sb=$(nri_sandbox_of "${nri_pod:-kt-nri}" 2> /dev/null || true)
  k delete deployment kt-nri --ignore-not-found --wait=false > /dev/null 2>&1 || true
  if [ -n "${sb}" ]; then poll 120 test ! -e "${nri_state}/k8s.io/${sb}" || true; fi
  k label node "${node}" "${seed_label}-" > /dev/null 2>&1 || true
  if [ -s "${nri_dir}/applied" ]; then
    local made=()
    mapfile -t made < "${nri_dir}/applied"
    k -n kube-system delete "${made[@]}" --ignore-not-found --wait=false > /dev/null 2>&1 || true
    poll 180 nri_ds_gone || true
  fi
  nri_own_leftovers
}

# The plugin checks every pod (nri_runtime_handlers = []), its own pod too, from its
# Synchronize on; its own sandbox is removed after the plugin has ended, so that pod's state
# and metrics textfile stay on the node after kubectl delete: removed here, as an operator
# would after removing the DaemonSet, and said on the console.
nri_own_leftovers() {
  local sb left=""
  for sb in $(nri_status | jq -r '.sandboxes[] | select(any(.verdicts[]; .[1].pod.name // "" | startswith("kata-topo-nri-"))) | .sandbox_id'); do
    rm -rf "${nri_state:?}/k8s.io/${sb}"
    rm -f "${nri_metrics}/kata-topo-k8s.io-${sb}.prom"
    left="${left} ${sb}"
  done
  rmdir "${nri_state}/k8s.io" 2> /dev/null || true
  [ -z "${left}" ] || say "the plugin left its own pod's state and metrics (sandbox${left}): removed"
}
