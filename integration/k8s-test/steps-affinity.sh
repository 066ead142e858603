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

# affinity_rs NAME [ANNOTATION...]: ReplicaSet NAME of one burstable pod requiring
# kata-topo.io/nic In [mlx5] and kata-topo.io/cores Gt 1; the ReplicaSet controller creates the
# pod and the scheduler places it on this node. The owner is what the wrapper names in its
# message, so an operator knows what to reschedule.
affinity_rs() {
  local name=$1 annotations="" a
  shift
  for a in "$@"; do annotations="${annotations}        ${a%%=*}: \"${a#*=}\"\n"; done
  printf '%b' "apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: ${name}}
spec:
  replicas: 1
  selector: {matchLabels: {app: ${name}}}
  template:
    metadata:
      labels: {app: ${name}}
${annotations:+      annotations:\n}${annotations}    spec:
      nodeSelector: {kubernetes.io/hostname: ${node}}
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

# The pod ReplicaSet NAME's controller created (its name has a random suffix).
affinity_pod_of() { # NAME
  local p
  p=$(k get pods -l "app=$1" -o jsonpath='{.items[0].metadata.name}' 2> /dev/null) && [ -n "${p}" ] && echo "${p}"
}
aff_audit=""
aff_enforce=""

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
# The Warning Event kata-topo posted on pod NAME for REASON (with the node's credentials), as
# kubectl get events --field-selector finds it: "type reason count reportingController", or
# nothing.
affinity_event() { # NAME REASON
  k get events --field-selector "involvedObject.name=$1,reason=$2" -o json 2> /dev/null \
    | jq -r '[.items[] | select(.reportingComponent == "kata-topo" or .source.component == "kata-topo")
        | "\(.type) \(.reason) \(.count // .series.count // 1) \(.reportingComponent // .source.component)"] | first // empty'
}
affinity_has_event() { [ -n "$(affinity_event "$1" "$2")" ]; }

step_affinity_violated_audit() {
  local mark rules restarts line baseline detail event diagnose drc=0
  affinity_label kata-topo.io/nic=mlx5 kata-topo.io/cores=2 \
    || { record affinity-violated-audit false "" "cannot label the node"; return 1; }
  affinity_rs kt-affinity || { record affinity-violated-audit false "" "cannot create ReplicaSet kt-affinity"; return 1; }
  affinity_rs kt-affinity-enforce kata-topo.io/mode=enforce \
    || { record affinity-violated-audit false "" "cannot create ReplicaSet kt-affinity-enforce"; return 1; }
  poll 120 affinity_pod_of kt-affinity || true
  poll 120 affinity_pod_of kt-affinity-enforce || true
  aff_audit=$(affinity_pod_of kt-affinity) aff_enforce=$(affinity_pod_of kt-affinity-enforce) \
    || { record affinity-violated-audit false "" "the ReplicaSet controller created no pod: $(k get rs -o wide 2>&1 | tail -n 2 | paste -sd ';')"; return 1; }
  if ! { poll 180 ready "${aff_audit}" && poll 180 ready "${aff_enforce}"; }; then
    record affinity-violated-audit false "" "the affinity pods are not ready: $(k get pods -o wide 2>&1 | tail -n 4 | paste -sd ';')"
    return 1
  fi
  # The wrapper kept the node's labels at the pod's first create.
  baseline=$(find "${state}" -name node-labels.json -exec jq -c --arg p "${aff_audit}" \
    'select(.pod.metadata.name == $p) | .node.metadata.labels | with_entries(select(.key | startswith("kata-topo.io/")))' {} + 2> /dev/null | head -n 1)
  affinity_label kata-topo.io/nic=e810 || true
  mark=$(log_mark)
  affinity_kill "${aff_audit}" || { record affinity-violated-audit false "" "cannot kill kt-affinity's container"; return 1; }
  poll 120 pod_field_is_at_least "${aff_audit}" '{.status.containerStatuses[0].restartCount}' 1 || true
  poll 120 ready "${aff_audit}" || true
  restarts=$(k get pod "${aff_audit}" -o jsonpath='{.status.containerStatuses[0].restartCount}')
  poll 20 logged_since "${mark}" node-affinity-violated || true
  rules=$(rules_since "${mark}" '.pod_name == "'"${aff_audit}"'" and .operation == "recreate" and .decision == "allow"')
  line=$(affinity_finding "${mark}" "${aff_audit}" node-affinity-violated)
  # Where the user looks: the pod's Events, and kata-topo diagnose on the node (the seed's three
  # questions: the label that moved, the term that fails).
  poll 60 affinity_has_event "${aff_audit}" NodeAffinityViolated || true
  event=$(affinity_event "${aff_audit}" NodeAffinityViolated)
  diagnose=$(KATA_TOPO_CONFIG="${run}/kata-topo.toml" timeout 60 "${bin}/kata-topo" diagnose "default/${aff_audit}" --state-dir "${state}" 2>&1) || drc=$?
  printf '%s\n' "${diagnose}" > "${results}/diagnose-kt-affinity.txt"
  detail="label baseline ${baseline:-none}; kubectl label node ${node} kata-topo.io/nic=e810 --overwrite; container killed: restartCount ${restarts}, ready $(k get pod "${aff_audit}" -o jsonpath='{.status.containerStatuses[0].ready}'); kubectl get events --field-selector reason=NodeAffinityViolated: ${event:-none}; kata-topo diagnose exit ${drc}: $(head -n 3 <<< "${diagnose}" | paste -sd '|' - | cut -c 1-500); finding: $(jq -c '{operation, severity, decision, msg, expected, observed}' <<< "${line:-null}" 2> /dev/null | cut -c 1-900)"
  if [ "${rules}" = node-affinity-violated ] && [ "${restarts:-0}" -ge 1 ] && ready "${aff_audit}" \
    && [ "${event%% *}" = Warning ] && [ "${drc}" = 1 ] \
    && grep -q '^node labels: changed.*kata-topo.io/nic "mlx5" -> "e810"' <<< "${diagnose}" \
    && grep -q '^affinity: violated' <<< "${diagnose}" \
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
  local mark rules waiting detail event
  mark=$(log_mark)
  affinity_kill "${aff_enforce}" || { record affinity-violated-enforce false "" "cannot kill kt-affinity-enforce's container"; return 1; }
  rm -f "${run}/waiting-${aff_enforce}"
  poll 120 waiting_has "${aff_enforce}" node-affinity-violated || true
  waiting=$(cat "${run}/waiting-${aff_enforce}" 2> /dev/null \
    || k get pod "${aff_enforce}" -o jsonpath='{.status.containerStatuses[0].state.waiting}')
  k get pod "${aff_enforce}" -o json > "${results}/kt-affinity-enforce.json" 2> /dev/null || true
  rules=$(rules_since "${mark}" '.pod_name == "'"${aff_enforce}"'" and .operation == "recreate" and .decision == "reject"')
  poll 60 affinity_has_event "${aff_enforce}" NodeAffinityViolated || true
  event=$(affinity_event "${aff_enforce}" NodeAffinityViolated)
  detail="kubectl get pod kt-affinity-enforce: state.waiting $(cut -c 1-800 <<< "${waiting:-absent}"); the refusal's Event: ${event:-none}"
  if [ "${rules}" = node-affinity-violated ] && grep -q 'kata-topo refused the recreate' <<< "${waiting}" \
    && [ "${event%% *}" = Warning ] \
    && grep -q 'node-affinity-violated' <<< "${waiting}" && ! ready "${aff_enforce}"; then
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
  resize_memory "${aff_audit}" 192 > /dev/null 2>&1 || true
  poll 120 pod_field_is "${aff_audit}" '{.status.containerStatuses[0].resources.limits.memory}' 192Mi || true
  applied=$(k get pod "${aff_audit}" -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  poll 20 logged_since "${mark}" node-labels-changed || true
  rules=$(rules_since "${mark}" '.pod_name == "'"${aff_audit}"'" and .operation == "update"')
  line=$(affinity_finding "${mark}" "${aff_audit}" node-labels-changed)
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
  id=$(k get pod "${aff_audit}" -o jsonpath='{.status.containerStatuses[0].containerID}')
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
  rules=$(rules_since "${mark}" '.pod_name == "'"${aff_audit}"'" and .operation == "update"')
  why=$(affinity_finding "${mark}" "${aff_audit}" node-labels-unavailable | jq -r '.msg // empty' 2> /dev/null)
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
}

# The ReplicaSets and the labels go; the pods go with every other in cleanup. kubectl waits for
# the API server's connection to come back.
affinity_teardown() {
  ip route del 10.0.2.100/32 via 10.0.2.99 2> /dev/null || true
  poll 60 k delete rs kt-affinity kt-affinity-enforce --ignore-not-found --wait=false > /dev/null 2>&1 || true
  k label node "${node}" kata-topo.io/nic- kata-topo.io/cores- > /dev/null 2>&1 || true
}
