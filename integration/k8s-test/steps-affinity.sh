#!/usr/bin/env bash
# k8s-test's node-affinity steps, sourced by guest.sh: a pod's required node affinity on a node
# label, the node relabelled with kubectl under it, and what the wrapper says at its next
# resize — against the API server on the host, read with the kubelet's own credentials.
# shellcheck disable=SC2154,SC2034 # the node, kubectl and the paths are guest.sh's and guest-lib.sh's; AFFINITY_STEPS is guest.sh's to use
set -euo pipefail

AFFINITY_STEPS=(affinity-violated-audit affinity-violated-enforce affinity-labels-changed
  affinity-api-unreachable)

# The labels the pods require: a NIC model and a core count (In, and Gt on an integer).
affinity_label() { # KEY=VALUE...
  k label node "${node}" "$@" --overwrite > /dev/null
}

# affinity_pod NAME OWNER_UID [ANNOTATION...]: a burstable pod on this node requiring
# kata-topo.io/nic In [mlx5] and kata-topo.io/cores Gt 1, owned (as its controller) by the
# ReplicaSet kt-affinity — which has no replicas and no controller-manager to act on it: the
# owner is what the wrapper names in its message, so an operator knows what to reschedule.
affinity_pod() {
  local name=$1 owner=$2 annotations="" a
  shift 2
  for a in "$@"; do annotations="${annotations}    ${a%%=*}: \"${a#*=}\"\n"; done
  printf '%b' "apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  labels: {app: kt-affinity-${name}}
  ownerReferences:
    - {apiVersion: apps/v1, kind: ReplicaSet, name: kt-affinity, uid: ${owner}, controller: true}
${annotations:+  annotations:\n}${annotations}spec:
  nodeName: ${node}
  runtimeClassName: kata-topo
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: kata-topo.io/nic, operator: In, values: [mlx5]}
              - {key: kata-topo.io/cores, operator: Gt, values: [\"1\"]}
  containers:
    - name: app
      image: localhost/kata-topo/busybox:1
      imagePullPolicy: Never
      command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while :; do sleep 1; done\"]
      resources:
        requests: {cpu: \"0\", memory: 64Mi}
        limits: {cpu: 200m, memory: 128Mi}
" | k apply -f - > /dev/null
}

affinity_owner() {
  k apply -f - > /dev/null << EOF
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: kt-affinity}
spec:
  replicas: 0
  selector: {matchLabels: {app: kt-affinity}}
  template:
    metadata: {labels: {app: kt-affinity}}
    spec: {containers: [{name: app, image: localhost/kata-topo/busybox:1}]}
EOF
  k get rs kt-affinity -o jsonpath='{.metadata.uid}'
}

# The finding line of RULE for pod NAME logged after line MARK (its JSON), if any.
affinity_finding() { # MARK NAME RULE
  tail -n "+$(($1 + 1))" "${log}" \
    | jq -c -R --arg p "$2" --arg r "$3" 'fromjson? | select(.event == "finding" and .pod_name == $p and .rule == $r)' \
    | tail -n 1
}

# Kills pod NAME's container: the kubelet starts a new one in the running sandbox (a recreate).
affinity_kill() { # NAME
  local id
  id=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  ctr -a "${sock}" -n k8s.io tasks kill -s KILL "${id#containerd://}" > /dev/null 2>&1
}

# Pods kt-affinity (audit) and kt-affinity-enforce (enforce) admitted on the labelled node,
# their label baseline kept; the node relabelled (kata-topo.io/nic: mlx5 -> e810) so their
# required term no longer holds. The kubelet (1.36) re-runs its own admission, NodeAffinity
# included, on a resize and refuses it before the runtime sees it; a container restart it
# never re-admits: kt-affinity's container killed, its recreate goes through, reported.
step_affinity_violated_audit() {
  local owner mark rules restarts line baseline detail
  affinity_label kata-topo.io/nic=mlx5 kata-topo.io/cores=2 \
    || { record affinity-violated-audit false "" "cannot label the node"; return 1; }
  owner=$(affinity_owner) || { record affinity-violated-audit false "" "cannot create ReplicaSet kt-affinity"; return 1; }
  affinity_pod kt-affinity "${owner}" || true
  affinity_pod kt-affinity-enforce "${owner}" kata-topo.io/mode=enforce || true
  if ! { poll 180 ready kt-affinity && poll 180 ready kt-affinity-enforce; }; then
    record affinity-violated-audit false "" "the affinity pods are not ready: $(k get pods -o wide 2>&1 | tail -n 4 | paste -sd ';')"
    return 1
  fi
  # The wrapper kept the node's labels at the pod's first create.
  baseline=$(find "${state}" -name node-labels.json -exec jq -c --arg p kt-affinity \
    'select(.pod.metadata.name == $p) | .node.metadata.labels | with_entries(select(.key | startswith("kata-topo.io/")))' {} + 2> /dev/null | head -n 1)
  affinity_label kata-topo.io/nic=e810 || true
  mark=$(log_mark)
  affinity_kill kt-affinity || { record affinity-violated-audit false "" "cannot kill kt-affinity's container"; return 1; }
  poll 120 pod_field_is_at_least kt-affinity '{.status.containerStatuses[0].restartCount}' 1 || true
  poll 120 ready kt-affinity || true
  restarts=$(k get pod kt-affinity -o jsonpath='{.status.containerStatuses[0].restartCount}')
  poll 20 logged_since "${mark}" node-affinity-violated || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-affinity" and .operation == "recreate" and .decision == "allow"')
  line=$(affinity_finding "${mark}" kt-affinity node-affinity-violated)
  detail="label baseline ${baseline:-none}; kubectl label node ${node} kata-topo.io/nic=e810 --overwrite; container killed: restartCount ${restarts}, ready $(k get pod kt-affinity -o jsonpath='{.status.containerStatuses[0].ready}'); finding: $(jq -c '{operation, severity, decision, msg, expected, observed}' <<< "${line:-null}" 2> /dev/null | cut -c 1-900)"
  if [ "${rules}" = node-affinity-violated ] && [ "${restarts:-0}" -ge 1 ] && ready kt-affinity \
    && jq -e '.severity == "error" and (.msg | contains("ReplicaSet kt-affinity"))
        and .observed.labels["kata-topo.io/nic"] == "e810"
        and .expected.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key == "kata-topo.io/nic"' \
      <<< "${line:-null}" > /dev/null 2>&1 \
    && jq -e '.["kata-topo.io/nic"] == "mlx5"' <<< "${baseline:-null}" > /dev/null 2>&1; then
    record affinity-violated-audit true "${rules}" "${detail}"
  else
    record affinity-violated-audit false "${rules}" "expected node-affinity-violated naming the ReplicaSet, the recreate through: ${detail}"
  fi
}

# The enforce pod's container killed on the relabelled node: its recreate refused, and kubectl
# shows why (the container waiting in CreateContainerError with kata-topo's message).
step_affinity_violated_enforce() {
  local mark rules waiting detail
  mark=$(log_mark)
  affinity_kill kt-affinity-enforce || { record affinity-violated-enforce false "" "cannot kill kt-affinity-enforce's container"; return 1; }
  poll 120 pod_field_has kt-affinity-enforce '{.status.containerStatuses[0].state.waiting.message}' node-affinity-violated || true
  waiting=$(k get pod kt-affinity-enforce -o jsonpath='{.status.containerStatuses[0].state.waiting}')
  k get pod kt-affinity-enforce -o json > "${results}/kt-affinity-enforce.json" 2> /dev/null || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-affinity-enforce" and .operation == "recreate" and .decision == "reject"')
  detail="kubectl get pod kt-affinity-enforce: state.waiting $(cut -c 1-800 <<< "${waiting:-absent}")"
  if [ "${rules}" = node-affinity-violated ] && grep -q 'kata-topo refused the recreate' <<< "${waiting}" \
    && grep -q 'node-affinity-violated' <<< "${waiting}" && ! ready kt-affinity-enforce; then
    record affinity-violated-enforce true "${rules}" "${detail}"
  else
    record affinity-violated-enforce false "${rules}" "expected the recreate refused, kata-topo's message in the container's waiting state: ${detail}"
  fi
}

# The node relabelled so the term holds again, with another value of a label it names
# (kata-topo.io/cores 2 -> 4, still Gt 1): a resize of kt-affinity gives node-labels-changed
# only, a warning.
step_affinity_labels_changed() {
  local mark rules line applied detail
  affinity_label kata-topo.io/nic=mlx5 kata-topo.io/cores=4 || true
  mark=$(log_mark)
  resize_memory kt-affinity 192 > /dev/null 2>&1 || true
  poll 120 pod_field_is kt-affinity '{.status.containerStatuses[0].resources.limits.memory}' 192Mi || true
  applied=$(k get pod kt-affinity -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  poll 20 logged_since "${mark}" node-labels-changed || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-affinity" and .operation == "update"')
  line=$(affinity_finding "${mark}" kt-affinity node-labels-changed)
  detail="kubectl label node ${node} kata-topo.io/nic=mlx5 kata-topo.io/cores=4 --overwrite; resize to 192Mi, in force ${applied}; finding: $(jq -c '{severity, decision, msg, expected: .expected.labels, observed}' <<< "${line:-null}" 2> /dev/null | cut -c 1-700)"
  if [ "${rules}" = node-labels-changed ] && [ "${applied}" = 192Mi ] \
    && jq -e '.severity == "warning" and .expected.labels["kata-topo.io/cores"] == "2"
        and .observed.labels["kata-topo.io/cores"] == "4"' <<< "${line:-null}" > /dev/null 2>&1; then
    record affinity-labels-changed true "${rules}" "${detail}"
  else
    record affinity-labels-changed false "${rules}" "expected node-labels-changed only: ${detail}"
  fi
}

# The API server unreachable during an update: the guest's route to 10.0.2.100 goes through
# an address nobody answers ARP for, so a connection waits (as to a hung API server) rather
# than being refused at once. A resize of kt-affinity through CRI goes through within the
# wrapper's api_timeout_ms with node-labels-unavailable saying why.
step_affinity_api_unreachable() {
  local id mark rc=0 t0 t1 ms rules why detail
  id=$(k get pod kt-affinity -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}
  ip route add 10.0.2.100/32 via 10.0.2.99 2> "${run}/err" \
    || { record affinity-api-unreachable false "" "cannot reroute 10.0.2.100: $(head -c 200 "${run}/err")"; return 1; }
  mark=$(log_mark)
  t0=$(date +%s%N)
  cri update "${id}" --memory $((224 << 20)) 2> "${run}/err" || rc=$?
  t1=$(date +%s%N)
  ip route del 10.0.2.100/32 via 10.0.2.99 2> /dev/null || true
  ms=$(((t1 - t0) / 1000000))
  poll 20 logged_since "${mark}" node-labels-unavailable || true
  rules=$(rules_since "${mark}" '.pod_name == "kt-affinity" and .operation == "update"')
  why=$(affinity_finding "${mark}" kt-affinity node-labels-unavailable | jq -r '.msg // empty' 2> /dev/null)
  detail="10.0.2.100 unreachable (ip route add 10.0.2.100/32 via 10.0.2.99); kt-affinity resized to 224Mi through CRI in ${ms} ms (the whole CRI call under TCG; api_timeout_ms ${api_timeout_ms}), exit ${rc}$( [ -s "${run}/err" ] && echo " ($(head -c 200 "${run}/err"))"); ${why}"
  # The wrapper waits api_timeout_ms for the API server and no longer (a connection through an
  # address nobody answers fails when ARP gives up, about 3 s, or runs into the deadline,
  # whichever comes first); the rest of the call is the emulated guest's own pace (the
  # kubelet-stopped step's resize takes as long).
  if [ "${rc}" = 0 ] && [ "${rules}" = node-labels-unavailable ] \
    && [ -n "${why}" ] && [ "${ms}" -lt $((api_timeout_ms + 15000)) ]; then
    record affinity-api-unreachable true "${rules}" "${detail}"
  else
    record affinity-api-unreachable false "${rules}" "expected the update through with node-labels-unavailable: ${detail}"
  fi
  # The ReplicaSet and the labels go; the pods go with every other in cleanup. kubectl waits
  # for the API server's connection to come back.
  poll 60 k delete rs kt-affinity --wait=false > /dev/null 2>&1 || true
  k label node "${node}" kata-topo.io/nic- kata-topo.io/cores- > /dev/null 2>&1 || true
}

run_affinity_steps() {
  step_affinity_violated_audit || true
  step_affinity_violated_enforce || true
  step_affinity_labels_changed || true
  step_affinity_api_unreachable || true
}
