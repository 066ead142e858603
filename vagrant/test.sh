#!/usr/bin/env bash
# The end-to-end fault scenario: a pod admitted on NUMA node 1 with a passed-through device,
# then the in-place updates that never pass the scheduler or the Topology Manager again — a
# relabelled node, an in-place resize, a cpuset push across nodes, a recreated container — and
# what the operator must see: the finding in the log, the containerd event, the node condition
# (kata-topo status as node-problem-detector's plugin), the metrics; and the refusal in
# enforce mode with the container still running.
#
# KT_TARGET=k8s (default, in the Vagrant VM): pods through kubectl, cpuset pushes through
#   crictl (the CPU manager's path, UpdateContainerResources), real Kata.
# KT_TARGET=local: the same steps through kata-topo-cri against a containerd whose kata-topo
#   handler delegates to runc (the integration tests run it this way).
set -euo pipefail

KT_TARGET=${KT_TARGET:-k8s}
KT_SOCK=${KT_SOCK:-/run/containerd/containerd.sock}
KT_LOG=${KT_LOG:-/var/log/kata-topo.log}
KT_STATE=${KT_STATE:-/run/kata-topo}
KT_METRICS=${KT_METRICS:-/var/lib/prometheus/node-exporter}
KT_BIN=${KT_BIN:-/usr/local/bin}
KT_NODE=${KT_NODE:-1}              # the NUMA node the pod is admitted on
KT_HOME_CPUS=${KT_HOME_CPUS:-2-3}  # CPUs of that node
KT_AWAY_CPUS=${KT_AWAY_CPUS:-0-1}  # CPUs of the other node
KT_VFIO=${KT_VFIO:-}               # local: the device node, /dev/vfio/<group> (the vm-test
                                   #   guest) or a character device standing in for /dev/vfio/42
work=$(mktemp -d)
events_pid=""

cleanup() {
  if [ -n "${events_pid}" ]; then kill "${events_pid}" 2>/dev/null || true; fi
  rm -rf "${work}"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

# --- what the operator sees -------------------------------------------------------------
findings_since=0
mark_log() { findings_since=$(wc -l < "${KT_LOG}" 2>/dev/null || echo 0); }
new_log() { tail -n "+$((findings_since + 1))" "${KT_LOG}" 2>/dev/null || true; }

expect_finding() { # RULE [DECISION]
  local rule=$1 decision=${2:-}
  if new_log | grep -F "\"rule\":\"${rule}\"" | grep -F "\"decision\":\"${decision}" > /dev/null; then
    ok "log: ${rule} ${decision}"
  else
    fail "no ${rule} ${decision} finding in ${KT_LOG}"
  fi
}

expect_no_finding() {
  if new_log | grep -F '"event":"finding"' > /dev/null; then
    fail "unexpected finding: $(new_log | grep -F '"event":"finding"' | head -n 1)"
  fi
  ok "log: no finding"
}

expect_operation() { # OPERATION
  if new_log | grep -F "\"operation\":\"$1\"" > /dev/null; then ok "log: a $1 was checked"; else fail "no $1 verdict in ${KT_LOG}"; fi
}

# kata-topo events reads the event service on every containerd version (containerd 2.3's
# `ctr events` cannot print a google.protobuf.StringValue payload).
start_events() {
  "${KT_BIN}/kata-topo" events --address "${KT_SOCK}" > "${work}/events" 2>/dev/null &
  events_pid=$!
  sleep 0.5
}

expect_event() { # RULE
  for _ in $(seq 1 50); do
    # One verdict: a line with the topic, then one indented line per finding.
    if grep -A20 -F /kata-topo/mismatch "${work}/events" | grep -qF " $1: "; then
      ok "kata-topo events: /kata-topo/mismatch with $1"
      return
    fi
    sleep 0.2
  done
  fail "kata-topo events printed no /kata-topo/mismatch with $1"
}

expect_condition() { # 1 (mismatch) or 0 (clean)
  local rc=0
  "${KT_BIN}/kata-topo" status --state-dir "${KT_STATE}" > "${work}/status" || rc=$?
  [ "${rc}" = "$1" ] || fail "kata-topo status exited ${rc}, expected $1: $(cat "${work}/status")"
  ok "kata-topo status exit ${rc} (node-problem-detector condition KataTopologyMismatch=$([ "$1" = 1 ] && echo True || echo False))"
  if [ "${KT_TARGET}" = k8s ] && [ "$1" = 1 ]; then
    for _ in $(seq 1 40); do
      if kubectl get node "$(hostname)" -o jsonpath='{.status.conditions[?(@.type=="KataTopologyMismatch")].status}' | grep -q True; then
        ok "node condition KataTopologyMismatch=True"
        return
      fi
      sleep 3
    done
    fail "node condition KataTopologyMismatch never became True"
  fi
}

expect_metric() { # RULE
  if [ "${KT_TARGET}" = k8s ]; then
    if curl -fsS http://127.0.0.1:9100/metrics | grep -E "^kata_topo_findings_total\{.*rule=\"$1\"" | grep -qv ' 0$'; then
      ok "node-exporter: kata_topo_findings_total{rule=\"$1\"}"
      return
    fi
  elif cat "${KT_METRICS}"/*.prom 2>/dev/null | grep -E "^kata_topo_findings_total\{.*rule=\"$1\"" | grep -qv ' 0$'; then
    ok "textfile: kata_topo_findings_total{rule=\"$1\"}"
    return
  fi
  fail "no kata_topo_findings_total for $1"
}

# --- driving the pod ----------------------------------------------------------------------
cri() { "${KT_BIN}/kata-topo-cri" --endpoint "${KT_SOCK}" "$@"; }

run_pod() { # NAME MODE -> sets pod, ctr
  local name=$1 mode=$2
  if [ "${KT_TARGET}" = local ]; then
    pod=$(cri run-pod "${name}" --annotation kata-topo.io/policy=single-numa-node \
      --annotation "kata-topo.io/numa-nodes=${KT_NODE}" --annotation "kata-topo.io/mode=${mode}")
    ctr=$(cri start "${pod}" app --cpus "${KT_HOME_CPUS}" --vfio "${KT_VFIO}")
  else
    kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  annotations:
    kata-topo.io/policy: single-numa-node
    kata-topo.io/numa-nodes: "${KT_NODE}"
    kata-topo.io/mode: ${mode}
    cdi.k8s.io/vfio: kata-topo.io/vfio=nic
spec:
  runtimeClassName: kata-topo
  containers:
    - name: app
      image: busybox:1.36
      command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
      resources:
        requests: {cpu: 500m, memory: 128Mi}
        limits: {cpu: "1", memory: 256Mi}
YAML
    kubectl wait --for=condition=Ready "pod/${name}" --timeout=300s
    pod=$(crictl pods --name "${name}" -q | head -n 1)
    ctr=$(crictl ps --pod "${pod}" --name app -q | head -n 1)
    # Admission: the CPU manager's shared pool, narrowed to the pod's node.
    crictl update --cpuset-cpus "${KT_HOME_CPUS}" "${ctr}"
  fi
}

push_cpuset() { # CPUS
  if [ "${KT_TARGET}" = local ]; then cri update "${ctr}" --cpus "$1"; else crictl update --cpuset-cpus "$1" "${ctr}"; fi
}

resize() {
  if [ "${KT_TARGET}" = local ]; then
    cri update "${ctr}" --cpus "${KT_HOME_CPUS}" --quota 150000 --memory 402653184
  else
    kubectl patch "pod/$1" --subresource resize --type strategic \
      -p '{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"1500m","memory":"384Mi"}}}]}}'
  fi
}

recreate() { # CPUS
  if [ "${KT_TARGET}" = local ]; then
    cri remove-container "${ctr}"
    ctr=$(cri start "${pod}" app --cpus "$1" --vfio "${KT_VFIO}")
  else
    # The kubelet recreates the container in its running sandbox.
    crictl stop "${ctr}"
    sleep 15
    ctr=$(crictl ps --pod "${pod}" --name app -q | head -n 1)
  fi
}

running_on() {
  if [ "${KT_TARGET}" = local ]; then
    cri status "${ctr}"
  else
    local pid
    pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "${ctr}")
    echo "RUNNING $(grep Cpus_allowed_list "/proc/${pid}/status" | awk '{print $2}')"
  fi
}

remove_pod() { # NAME
  if [ "${KT_TARGET}" = local ]; then cri remove-pod "${pod}"; else kubectl delete "pod/$1" --wait=true; fi
}

# --- the scenario -------------------------------------------------------------------------
step "target ${KT_TARGET}: containerd ${KT_SOCK}, log ${KT_LOG}, state ${KT_STATE}"
start_events
mark_log

step "admission: pod on NUMA node ${KT_NODE} (CPUs ${KT_HOME_CPUS}) with its device"
run_pod kt-audit audit
expect_no_finding
expect_condition 0

if [ "${KT_TARGET}" = k8s ]; then
  step "the node is relabelled: the scheduler never looks at the running pod again"
  kubectl label node "$(hostname)" kata-topo.io/gpu-node=false --overwrite
  ok "relabelled; placement is what kata-topo checks, not labels"
fi

step "in-place resize on the same node"
mark_log
resize kt-audit
expect_no_finding

step "cpuset push across NUMA nodes (CPUs ${KT_AWAY_CPUS})"
mark_log
push_cpuset "${KT_AWAY_CPUS}"
expect_finding cpu-outside-intent allow
expect_finding vfio-remote allow
expect_event cpu-outside-intent
expect_event vfio-remote
expect_condition 1
expect_metric cpu-outside-intent
echo "container: $(running_on)"

step "the container is recreated in its running pod"
mark_log
recreate "${KT_AWAY_CPUS}"
expect_operation recreate
remove_pod kt-audit

step "enforce mode: the same push is refused, the container keeps running"
mark_log
run_pod kt-enforce enforce
if push_cpuset "${KT_AWAY_CPUS}" 2> "${work}/refusal"; then
  fail "the crossing push went through in enforce mode"
fi
grep -q FailedPrecondition "${work}/refusal" || grep -qi "failed precondition" "${work}/refusal" \
  || fail "the refusal is not FailedPrecondition: $(cat "${work}/refusal")"
ok "refused: $(head -c 200 "${work}/refusal")"
expect_finding cpu-outside-intent reject
expect_finding vfio-remote reject
state=$(running_on)
case "${state}" in
  "RUNNING ${KT_HOME_CPUS}") ok "container still running on ${KT_HOME_CPUS}" ;;
  *) fail "container state after refusal: ${state}" ;;
esac
remove_pod kt-enforce

step "scenario passed"
