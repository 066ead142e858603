#!/usr/bin/env bash
# k8s-test's NRI story, sourced by guest.sh: the seed's fault caught by kata-topo-nri instead of
# the wrapper. containerd 2.x only (NRI on in the guest's configuration version 3; 1.6 has no
# NRI). The plugin runs on node A with the node's [topology_guard] configuration; the pod is on
# the default runc handler (no RuntimeClass, no wrapper), in enforce mode, requiring a label the
# operator then changes; the kubelet's in-place image change is refused by the plugin before
# runc sees it, and kubectl shows kata-topo's message.
# shellcheck disable=SC2154,SC2034 # the node, kubectl and the paths are guest.sh's and guest-lib.sh's
set -euo pipefail

NRI_STEPS=(nri-plugin nri-admission nri-recreate-refused)

nri_pid=""
nri_pod=""
nri_mark=0

# grep without -q: see logged_since (guest.sh).
nri_logged() { tail -n "+$((nri_mark + 1))" "${log}" 2> /dev/null | grep -F -- "$1" > /dev/null; }

step_nri_plugin() {
  if [ -z "${containerd_bin}" ]; then
    record nri-plugin false "" "containerd $(cat "${results}/containerd.version" 2> /dev/null) has no NRI: the story runs on the containerd 2.3.4 leg"
    return 1
  fi
  nri_mark=$(log_mark)
  "${bin}/kata-topo-nri" --config "${run}/kata-topo.toml" --socket /run/nri/nri.sock \
    < /dev/null >> "${results}/kata-topo-nri.log" 2>&1 &
  nri_pid=$!
  poll 60 nri_logged '"event":"nri-synchronized"' || true
  local detail
  detail="kata-topo-nri --config ${run}/kata-topo.toml --socket /run/nri/nri.sock (pid ${nri_pid}); its log: $(tail -n "+$((nri_mark + 1))" "${log}" | jq -R -r 'fromjson? | select(.event // "" | startswith("nri-")) | .event' | paste -sd ' '); containerd: $(grep -a 'kata-topo' "${results}/containerd.log" | grep -a -i 'plugin' | tail -n 1 | cut -c 1-300)"
  if kill -0 "${nri_pid}" 2> /dev/null && nri_logged '"event":"nri-registered"' && nri_logged '"event":"nri-synchronized"'; then
    record nri-plugin true "" "${detail}"
  else
    record nri-plugin false "" "expected the plugin registered and synchronised: ${detail}; stderr: $(tail -n 3 "${results}/kata-topo-nri.log" | cut -c 1-300)"
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

# The plugin's verdicts for pod NAME in the state it shares with the wrapper.
nri_verdicts() {
  "${bin}/kata-topo" status --state-dir "${state}" --json 2> /dev/null \
    | jq -c --arg p "$1" '[.sandboxes[].verdicts[] | .[1] | select(.pod.name == $p) | {operation, decision, findings: [.findings[].rule]}]'
}
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
  mark=$(log_mark)
  k label node "${node}" "${seed_label}=nic-b" --overwrite > /dev/null \
    || { record nri-recreate-refused false "" "cannot relabel ${node}"; return 1; }
  k set image "pod/${nri_pod}" app=localhost/kata-topo/busybox:2 > /dev/null \
    || { record nri-recreate-refused false "" "kubectl set image pod/${nri_pod} failed"; return 1; }
  poll 180 pod_field_has "${nri_pod}" '{.status.containerStatuses[0].state.waiting.message}' node-affinity-violated || true
  describe=$(k describe pod "${nri_pod}" 2>&1 || true)
  printf '%s\n' "${describe}" > "${results}/describe-kt-nri.txt"
  rules=$(rules_since "${mark}" '.pod_name == "'"${nri_pod}"'" and .operation == "recreate" and .decision == "reject"')
  local detail
  detail="kubectl label node ${node} ${seed_label}=nic-b --overwrite; kubectl set image pod/${nri_pod} app=localhost/kata-topo/busybox:2; kubectl describe pod: $(grep -E -A2 '^ +State: +Waiting' <<< "${describe}" | sed 's/^ *//' | paste -sd ' ' | cut -c 1-700)"
  if [ "${rules}" = node-affinity-violated ] && grep -q 'kata-topo refused the recreate' <<< "${describe}" \
    && grep -q 'node-affinity-violated' <<< "${describe}" && ! ready "${nri_pod}"; then
    record nri-recreate-refused true "${rules}" "${detail}"
  else
    record nri-recreate-refused false "${rules}" "expected the plugin to refuse the recreate, kata-topo's message in the waiting state: ${detail}"
  fi
}

# The Deployment and the label go; the plugin keeps running, as a node's service would, until
# the node ends (after cleanup: a pod's state is the plugin's to clear when its sandbox goes).
nri_teardown() {
  k delete deployment kt-nri --ignore-not-found --wait=false > /dev/null 2>&1 || true
  k label node "${node}" "${seed_label}-" > /dev/null 2>&1 || true
}
