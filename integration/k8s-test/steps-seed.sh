#!/usr/bin/env bash
# k8s-test's seed story, sourced by guest.sh: the fault kata-topo exists for, played as a user
# would with kubectl on the two-node cluster. A Deployment whose pod requires a label only node A
# (this guest) has is placed there by the scheduler; the operator moves the label to node B (the
# host's node, node-b.sh); the in-place upgrades Kubernetes performs on a running pod (a new
# image, a resize, a restart) never pass the scheduler again, and kata-topo says the pod's
# affinity no longer holds; a rolling upgrade creates a new pod that the scheduler places on
# node B, clean. A pod whose placement never named the label is untouched.
# shellcheck disable=SC2154,SC2034 # the node, kubectl and the paths are guest.sh's and guest-lib.sh's
set -euo pipefail

SEED_STEPS=(seed-scheduled seed-image seed-resize seed-restart seed-enforce seed-no-affinity
  seed-rolling)

node_b=kata-topo-b
node_b_share=${results}/node-b
seed_label=example.com/accelerator
seed_pod="" seed_uid="" seed_ip="" seed_enforce="" seed_plain="" seed_mark=0

node_b_ready() { [ "$(k get node "${node_b}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# Node B joins (the story node-b, before the installer's and the seed's): the host started its
# containerd with the wrapper; the guest asks for its kubelet now.
step_node_b() {
  local s detail
  s=$(cat "${node_b_share}/status" 2> /dev/null || true)
  case "${s}" in
    containerd | kubelet) ;;
    *)
      record node-b false "" "node B did not come up on the host (${s:-no status}): $(tail -n 5 "${node_b_share}/node-b.log" "${node_b_share}/run.log" 2> /dev/null | paste -sd ' ' | cut -c 1-600)"
      return 1
      ;;
  esac
  touch "${node_b_share}/start"
  if ! poll 240 node_b_ready; then
    record node-b false "" "node ${node_b} not Ready: $(k get node "${node_b}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}' 2>&1 | cut -c 1-300); kubelet: $(tail -n 3 "${node_b_share}/kubelet.log" 2> /dev/null | cut -c 1-300 | paste -sd ' ')"
    return 1
  fi
  k label node "${node_b}" katacontainers.io/kata-runtime=true kata-topo.io/installed=true --overwrite > /dev/null \
    || { record node-b false "" "cannot label ${node_b}"; return 1; }
  nodes_json
  detail="kubectl get nodes: $(k get nodes -o jsonpath='{range .items[*]}{.metadata.name} Ready={.status.conditions[?(@.type=="Ready")].status} {.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion} cpu={.status.allocatable.cpu}; {end}')"
  if node_b_ready && ready_node "${node}" && grep -q "${node_b} Ready=True" <<< "${detail}"; then
    record node-b true "" "${detail}"
  else
    record node-b false "" "expected both nodes Ready: ${detail}"
  fi
}
ready_node() { [ "$(k get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# seed_deploy NAME guaranteed|burstable affinity|hostname [ANNOTATION...]: a Deployment of one
# pod on the pod network, runtime class kata-topo; `affinity` requires example.com/accelerator
# In [nic-a], `hostname` only names node A (a placement that never names the label).
seed_deploy() {
  local name=$1 qos=$2 place=$3 annotations="" a resources placement
  shift 3
  for a in "$@"; do annotations="${annotations}        ${a%%=*}: \"${a#*=}\"\n"; done
  case "${qos}" in
    guaranteed) resources='requests: {cpu: "1", memory: 256Mi}
            limits: {cpu: "1", memory: 256Mi}' ;;
    *) resources='requests: {cpu: "0", memory: 64Mi}
            limits: {cpu: 200m, memory: 128Mi}' ;;
  esac
  case "${place}" in
    affinity) placement="affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {key: ${seed_label}, operator: In, values: [nic-a]}" ;;
    *) placement="nodeSelector: {kubernetes.io/hostname: ${node}}" ;;
  esac
  printf '%b' "apiVersion: apps/v1
kind: Deployment
metadata: {name: ${name}}
spec:
  replicas: 1
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  selector: {matchLabels: {app: ${name}}}
  template:
    metadata:
      labels: {app: ${name}}
${annotations:+      annotations:\n}${annotations}    spec:
      runtimeClassName: kata-topo
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      ${placement}
      containers:
        - name: app
          image: localhost/kata-topo/busybox:1
          imagePullPolicy: Never
          command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while :; do sleep 1; done\"]
          resources:
            ${resources}
" | k apply -f - > /dev/null
}

# The running pod of Deployment NAME (the one not being deleted).
seed_pod_of() { # NAME
  local p
  p=$(k get pods -l "app=$1" -o json 2> /dev/null \
    | jq -r '[.items[] | select(.metadata.deletionTimestamp == null)] | .[0].metadata.name // empty') && [ -n "${p}" ] && echo "${p}"
}
pod_of_ready() { local p; p=$(seed_pod_of "$1") && ready "${p}"; }
pod_where() { # NAME: "uid ip node"
  k get pod "$1" -o jsonpath='{.metadata.uid} {.status.podIP} {.spec.nodeName}'
}
scheduled_event() { # POD: the Scheduled event's message
  k get events --field-selector "involvedObject.name=$1,reason=Scheduled" -o jsonpath='{.items[0].message}' 2> /dev/null || true
}
kill_app() { # POD
  local id
  id=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  ctr -a "${sock}" -n k8s.io tasks kill -s KILL "${id#containerd://}" > /dev/null 2>&1
}
restarts_of() { k get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
# The latest verdict of pod NAME as JSON {operation, decision, findings: [rules]}.
verdict_brief() { jq -c '{operation, decision, findings: [.findings[].rule]}' <<< "$(verdict_of "$1")" 2> /dev/null || echo null; }
recreate_violated() { # POD
  has_verdict "$1" '.operation == "recreate" and any(.findings[]; .rule == "node-affinity-violated")'
}

# 1. Scheduled by the scheduler to node A, the only node with the label.
step_seed_scheduled() {
  local where sched e_sched p_sched
  seed_mark=$(log_mark)
  k label node "${node_b}" "${seed_label}-" > /dev/null 2>&1 || true
  k label node "${node}" "${seed_label}=nic-a" --overwrite > /dev/null \
    || { record seed-scheduled false "" "cannot label ${node}"; return 1; }
  seed_deploy kt-seed guaranteed affinity || { record seed-scheduled false "" "cannot create Deployment kt-seed"; return 1; }
  seed_deploy kt-seed-enforce burstable affinity kata-topo.io/mode=enforce \
    || { record seed-scheduled false "" "cannot create Deployment kt-seed-enforce"; return 1; }
  seed_deploy kt-plain burstable hostname || { record seed-scheduled false "" "cannot create Deployment kt-plain"; return 1; }
  local d
  for d in kt-seed kt-seed-enforce kt-plain; do
    if ! poll 240 pod_of_ready "${d}"; then
      record seed-scheduled false "" "Deployment ${d}'s pod not ready: $(k get pods -o wide 2>&1 | tail -n 4 | paste -sd ';' | cut -c 1-600); $(k get events --field-selector reason=FailedScheduling -o jsonpath='{.items[-1:].message}' 2> /dev/null | cut -c 1-300)"
      return 1
    fi
  done
  seed_pod=$(seed_pod_of kt-seed) seed_enforce=$(seed_pod_of kt-seed-enforce) seed_plain=$(seed_pod_of kt-plain)
  where=$(pod_where "${seed_pod}")
  read -r seed_uid seed_ip _ <<< "${where}"
  sched=$(scheduled_event "${seed_pod}")
  e_sched=$(scheduled_event "${seed_enforce}")
  p_sched=$(scheduled_event "${seed_plain}")
  local detail
  detail="kubectl label node ${node} ${seed_label}=nic-a; Deployment kt-seed (Guaranteed, requires ${seed_label} In [nic-a]): pod ${seed_pod} uid ${seed_uid} IP ${seed_ip} QoS $(k get pod "${seed_pod}" -o jsonpath='{.status.qosClass}'); Scheduled: ${sched:-none}; kt-seed-enforce: ${e_sched:-none}; kt-plain: ${p_sched:-none}; nodes: $(k get nodes -o name | paste -sd ' ')"
  if grep -q "to ${node}\$" <<< "${sched}" && grep -q "to ${node}\$" <<< "${e_sched}" && grep -q "to ${node}\$" <<< "${p_sched}" \
    && [ "${where##* }" = "${node}" ] && [ "${seed_ip%.*}" = "${pod_cidr%.*}" ] && node_b_ready; then
    record seed-scheduled true "" "${detail}"
  else
    record seed-scheduled false "" "expected all three scheduled to ${node} with an address of ${pod_cidr}, node B Ready: ${detail}"
  fi
}

# 2 and 3a. The label moved to node B; the pod's image changed in place: the kubelet kills the
# container and creates the new one in the same sandbox.
container_of() { k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}'; }
container_is_new() { # POD OLD-ID: a container other than OLD-ID, ready
  local c
  c=$(container_of "$1") && [ -n "${c}" ] && [ "${c}" != "$2" ] && ready "$1"
}
step_seed_image() {
  local mark before after restarts image line event old_id new_id
  before=$(restarts_of "${seed_pod}")
  old_id=$(container_of "${seed_pod}")
  if ! { k label node "${node}" "${seed_label}-" > /dev/null && k label node "${node_b}" "${seed_label}=nic-a" --overwrite > /dev/null; }; then
    record seed-image false "" "cannot move the label ${seed_label}"
    return 1
  fi
  mark=$(log_mark)
  k set image "pod/${seed_pod}" app=localhost/kata-topo/busybox:2 > /dev/null \
    || { record seed-image false "" "kubectl set image pod/${seed_pod} failed"; return 1; }
  poll 180 container_is_new "${seed_pod}" "${old_id}" || true
  poll 60 recreate_violated "${seed_pod}" || true
  restarts=$(restarts_of "${seed_pod}")
  new_id=$(container_of "${seed_pod}")
  # The pod's spec names the new tag; the status names the image by its first tag (busybox:2 is
  # another tag of the same image).
  image=$(k get pod "${seed_pod}" -o jsonpath='{.spec.containers[0].image}')
  after=$(pod_where "${seed_pod}")
  line=$(affinity_finding "${mark}" "${seed_pod}" node-affinity-violated)
  poll 60 affinity_has_event "${seed_pod}" NodeAffinityViolated || true
  event=$(affinity_event "${seed_pod}" NodeAffinityViolated)
  local detail
  detail="kubectl label node ${node} ${seed_label}-; kubectl label node ${node_b} ${seed_label}=nic-a; kubectl set image pod/${seed_pod} app=localhost/kata-topo/busybox:2: spec image ${image}, container ${old_id#containerd://} -> ${new_id#containerd://}, restartCount ${before} -> ${restarts}, uid/IP/node ${seed_uid} ${seed_ip} ${node} -> ${after}; latest verdict $(verdict_brief "${seed_pod}"); Event: ${event:-none}; finding: $(jq -c '{msg, expected, observed}' <<< "${line:-null}" 2> /dev/null | cut -c 1-700)"
  if [ "${after}" = "${seed_uid} ${seed_ip} ${node}" ] && [ "${restarts:-0}" -gt "${before:-0}" ] \
    && [ -n "${new_id}" ] && [ "${new_id}" != "${old_id}" ] && grep -q busybox:2 <<< "${image}" && recreate_violated "${seed_pod}" && [ "${event%% *}" = Warning ] \
    && jq -e --arg l "${seed_label}" '(.msg | contains("Deployment kt-seed") or contains("ReplicaSet kt-seed"))
        and .expected.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key == $l
        and (.observed.labels[$l] == null)' <<< "${line:-null}" > /dev/null 2>&1; then
    record seed-image true "node-affinity-violated" "${detail}"
  else
    record seed-image false "$(rules_since "${mark}" '.pod_name == "'"${seed_pod}"'"')" "expected the same pod, a new container with node-affinity-violated naming the term and the label: ${detail}"
  fi
}

# 3b. A resize through the resize subresource: the kubelet 1.36 re-runs its own admission
# (NodeAffinity among it) and holds the resize before the runtime sees it; kata-topo, asked on
# the node, says the same of the pod's affinity.
resize_pending() { # POD: the PodResizePending condition "reason: message"
  k get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodResizePending")].reason}: {.status.conditions[?(@.type=="PodResizePending")].message}'
}
has_resize_pending() { [ "$(resize_pending "$1")" != ": " ]; }
# The update requests (the wrapper's debug log) after line MARK that set task ID's memory
# limit to BYTES: what of a resize reached the runtime.
updates_reaching() { # MARK ID BYTES
  tail -n "+$(($1 + 1))" "${log}" | jq -R -c --arg id "$2" --argjson b "$3" \
    'fromjson? | select(.event == "update-request" and .task_id == $id and .resources.memory.limit == $b) | .ts' | wc -l
}
step_seed_resize() {
  local g b g_mem b_mem diagnose drc=0 mark g_id b_id g_upd b_upd
  mark=$(log_mark)
  g_id=$(container_of "${seed_pod}")
  b_id=$(container_of "${seed_enforce}")
  k patch pod "${seed_pod}" --subresource resize --type strategic \
    -p '{"spec":{"containers":[{"name":"app","resources":{"requests":{"memory":"320Mi"},"limits":{"memory":"320Mi"}}}]}}' > /dev/null 2>&1 || true
  resize_memory "${seed_enforce}" 160 > /dev/null 2>&1 || true
  poll 90 has_resize_pending "${seed_pod}" || true
  poll 90 has_resize_pending "${seed_enforce}" || true
  g=$(resize_pending "${seed_pod}")
  b=$(resize_pending "${seed_enforce}")
  g_mem=$(k get pod "${seed_pod}" -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  b_mem=$(k get pod "${seed_enforce}" -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  g_upd=$(updates_reaching "${mark}" "${g_id#containerd://}" $((320 << 20)))
  b_upd=$(updates_reaching "${mark}" "${b_id#containerd://}" $((160 << 20)))
  diagnose=$(KATA_TOPO_CONFIG="${run}/kata-topo.toml" timeout 60 "${bin}/kata-topo" diagnose "default/${seed_pod}" --state-dir "${state}" 2>&1) || drc=$?
  printf '%s\n' "${diagnose}" > "${results}/diagnose-kt-seed.txt"
  local detail
  detail="kubectl patch --subresource resize: ${seed_pod} (Guaranteed) memory 320Mi: PodResizePending ${g}, in force ${g_mem}; ${seed_enforce} (Burstable) limit 160Mi: PodResizePending ${b}, in force ${b_mem}; update requests with the new limits that reached the runtime: ${g_upd} / ${b_upd}; kata-topo diagnose exit ${drc}: $(grep -E '^(affinity|node labels):' <<< "${diagnose}" | paste -sd '|' | cut -c 1-400)"
  if [ "${g}" != ": " ] && grep -q 'NodeAffinity' <<< "${b}" && [ "${g_mem}" = 256Mi ] && [ "${b_mem}" = 128Mi ] \
    && [ "${g_upd}" = 0 ] && [ "${b_upd}" = 0 ] \
    && [ "${drc}" = 1 ] && grep -q '^affinity: violated' <<< "${diagnose}"; then
    record seed-resize true "" "${detail}"
  else
    record seed-resize false "" "expected both resizes held by the kubelet (the Burstable one for NodeAffinity), nothing applied, and kata-topo diagnose saying the affinity is violated: ${detail}"
  fi
}

# 3c. The container killed: the kubelet restarts it in the running sandbox, the same verdict.
step_seed_restart() {
  local before restarts after mark
  local old_id
  before=$(restarts_of "${seed_pod}")
  old_id=$(container_of "${seed_pod}")
  mark=$(log_mark)
  kill_app "${seed_pod}" || { record seed-restart false "" "cannot kill ${seed_pod}'s container"; return 1; }
  poll 180 container_is_new "${seed_pod}" "${old_id}" || true
  restarts=$(restarts_of "${seed_pod}")
  after=$(pod_where "${seed_pod}")
  local detail
  detail="container killed: restartCount ${before} -> ${restarts}, uid/IP/node ${after}; latest verdict $(verdict_brief "${seed_pod}")"
  if [ "${after}" = "${seed_uid} ${seed_ip} ${node}" ] && [ "${restarts:-0}" -gt "${before:-0}" ] && ready "${seed_pod}" \
    && jq -e '.operation == "recreate" and .decision == "allow" and (.findings | index("node-affinity-violated"))' \
      <<< "$(verdict_brief "${seed_pod}")" > /dev/null; then
    record seed-restart true "node-affinity-violated" "${detail}"
  else
    record seed-restart false "$(rules_since "${mark}" '.pod_name == "'"${seed_pod}"'"')" "expected the recreate in the same pod, allowed with node-affinity-violated: ${detail}"
  fi
}

# 3, enforce. The enforce pod's container killed: its recreate refused; kubectl describe pod
# shows kata-topo's message in the container's waiting state.
step_seed_enforce() {
  local describe waiting
  kill_app "${seed_enforce}" || { record seed-enforce false "" "cannot kill ${seed_enforce}'s container"; return 1; }
  poll 180 pod_field_has "${seed_enforce}" '{.status.containerStatuses[0].state.waiting.message}' node-affinity-violated || true
  waiting=$(k get pod "${seed_enforce}" -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}')
  describe=$(k describe pod "${seed_enforce}" 2>&1 || true)
  printf '%s\n' "${describe}" > "${results}/describe-kt-seed-enforce.txt"
  local detail
  detail="kubectl describe pod ${seed_enforce}: $(grep -E -A2 '^ +State: +Waiting' <<< "${describe}" | sed 's/^ *//' | paste -sd ' ' | cut -c 1-700)"
  if grep -q 'kata-topo refused the recreate' <<< "${describe}" && grep -q node-affinity-violated <<< "${describe}" \
    && [ -n "${waiting}" ] && ! ready "${seed_enforce}"; then
    record seed-enforce true "node-affinity-violated" "${detail}"
  else
    record seed-enforce false "" "expected the recreate refused with kata-topo's message in the waiting state: ${detail}"
  fi
}

# 4. The contrast: a rolling upgrade creates a new pod, which the scheduler places where the
# label is now, node B; its sandbox there is new, and clean.
node_b_ask() { # WHAT [ARG]: node-b.sh's answer (its answer()), from inside node B's namespaces
  local answer=${node_b_share}/$1
  [ "$1" = status ] && answer=${answer}.json
  rm -f "${answer}"
  printf '%s' "${2:-}" > "${node_b_share}/ask-$1.tmp" && mv "${node_b_share}/ask-$1.tmp" "${node_b_share}/ask-$1"
  poll 20 test -e "${answer}" || return 1
  cat "${answer}"
}
node_b_verdicts() { # POD: kata-topo status on node B, the pod's verdicts [{operation, findings}]
  node_b_ask status 2> /dev/null \
    | jq -c --arg p "$1" '[.sandboxes[].verdicts[] | .[1] | select(.pod.name == $p) | {operation, findings: [.findings[].rule]}]'
}
step_seed_rolling() {
  local new where sched rc=0 old_gone=no v b_findings
  k set image deployment/kt-seed app=localhost/kata-topo/busybox:2 > /dev/null \
    || { record seed-rolling false "" "kubectl set image deployment/kt-seed failed"; return 1; }
  timeout 300 "${k8s}/kubectl" --kubeconfig "${results}/k8s/admin.kubeconfig" rollout status deployment/kt-seed --timeout=280s \
    > "${run}/rollout" 2>&1 || rc=$?
  new=$(seed_pod_of kt-seed || true)
  poll 120 inst_gone_default "${seed_pod}" && old_gone=yes
  where=$(pod_where "${new:-none}" 2> /dev/null || true)
  sched=$(scheduled_event "${new:-none}")
  poll 30 node_b_has_verdict "${new:-none}" || true
  v=$(node_b_verdicts "${new:-none}")
  b_findings=$(grep -c '"event":"finding"' "${node_b_share}/kata-topo.log" 2> /dev/null || true)
  local detail
  detail="kubectl set image deployment/kt-seed; rollout status exit ${rc}: $(tail -n 1 "${run}/rollout"); new pod ${new:-none}: uid/IP/node ${where:-?}; Scheduled: ${sched:-none}; old pod ${seed_pod} gone: ${old_gone}; node B's kata-topo status for it: ${v:-none}; findings in node B's log: ${b_findings}"
  if [ "${rc}" = 0 ] && [ -n "${new}" ] && [ "${new}" != "${seed_pod}" ] && [ "${where##* }" = "${node_b}" ] \
    && grep -q "to ${node_b}\$" <<< "${sched}" && [ "${old_gone}" = yes ] && [[ "${where}" == *" 10.244.1."* ]] \
    && jq -e 'length > 0 and all(.[]; (.findings | length) == 0)' <<< "${v:-null}" > /dev/null && [ "${b_findings}" = 0 ]; then
    record seed-rolling true "" "${detail}"
  else
    record seed-rolling false "" "expected a new pod scheduled to ${node_b}, the old one gone, node B's wrapper checking it clean: ${detail}"
  fi
}
inst_gone_default() { ! k get pod "$1" > /dev/null 2>&1; }
node_b_has_verdict() { jq -e 'length > 0' <<< "$(node_b_verdicts "$1")" > /dev/null 2>&1; }

# 5. A pod whose placement never named the label, on node A: restarted and resized after the
# relabel, no finding. (Before the rolling upgrade: kt-seed's pod leaving node A gives its CPU
# back to the shared pool, and the CPU manager's push of it to this pod is a finding of its own,
# cpu-outside-intent, as in the core story's pool-grows.)
step_seed_no_affinity() {
  local before restarts mem v rules
  local old_id mark new_id reached
  before=$(restarts_of "${seed_plain}")
  old_id=$(container_of "${seed_plain}")
  kill_app "${seed_plain}" || { record seed-no-affinity false "" "cannot kill ${seed_plain}'s container"; return 1; }
  poll 180 container_is_new "${seed_plain}" "${old_id}" || true
  mark=$(log_mark)
  new_id=$(container_of "${seed_plain}")
  resize_memory "${seed_plain}" 160 > /dev/null 2>&1 || true
  poll 120 pod_field_is "${seed_plain}" '{.status.containerStatuses[0].resources.limits.memory}' 160Mi || true
  poll 30 has_verdict "${seed_plain}" '.operation == "update"' || true
  restarts=$(restarts_of "${seed_plain}")
  mem=$(k get pod "${seed_plain}" -o jsonpath='{.status.containerStatuses[0].resources.limits.memory}')
  v=$(verdict_brief "${seed_plain}")
  # What the relabel could have caused: a node-* finding (node-affinity-violated,
  # node-labels-changed). Others say other things (a slow kubelet under TCG:
  # kubelet-intent-unavailable) and are shown, not counted.
  rules=$(rules_since "${seed_mark}" '.pod_name == "'"${seed_plain}"'" and (.rule | startswith("node-"))')
  local other
  other=$(rules_since "${seed_mark}" '.pod_name == "'"${seed_plain}"'" and (.rule | startswith("node-") | not)')
  # The same count seed-resize found 0 of: here the resize reaches the runtime, once.
  reached=$(updates_reaching "${mark}" "${new_id#containerd://}" $((160 << 20)))
  local detail
  detail="${seed_plain} (nodeSelector kubernetes.io/hostname: ${node}, no affinity): container killed, restartCount ${before} -> ${restarts}; resized to 160Mi, in force ${mem}, update requests with it that reached the runtime: ${reached}; latest verdict ${v}; node-* findings since the story began: [${rules}], others: [${other}]"
  if [ "${restarts:-0}" -gt "${before:-0}" ] && [ "${mem}" = 160Mi ] && [ -z "${rules}" ] && [ "${reached}" -ge 1 ] \
    && jq -e '.operation == "update" and all(.findings[]; startswith("node-") | not)' <<< "${v}" > /dev/null; then
    record seed-no-affinity true "" "${detail}"
  else
    record seed-no-affinity false "${rules}" "expected the restart and the resize through with no finding: ${detail}"
  fi
}

# What the story made goes: the Deployments (their pods go with every other in cleanup) and
# the label on both nodes.
seed_teardown() {
  k delete deployment kt-seed kt-seed-enforce kt-plain --ignore-not-found --wait=false > /dev/null 2>&1 || true
  k label node "${node}" "${seed_label}-" > /dev/null 2>&1 || true
  k label node "${node_b}" "${seed_label}-" > /dev/null 2>&1 || true
}

# Node B's leftovers, asked of the host (node-b.sh answers within a second or two).
node_b_leftovers() {
  local left
  [ "$(cat "${node_b_share}/status" 2> /dev/null)" = kubelet ] || return 0
  left=$(node_b_ask leftovers) || { echo "node B did not answer"; return 0; }
  local line
  while IFS= read -r line; do [ -z "${line}" ] || echo "node B: ${line}"; done <<< "${left}"
}
