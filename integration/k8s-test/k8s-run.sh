#!/usr/bin/env bash
# make k8s-run STEPS=...: the stories named (or those holding the steps named) run on the
# cluster `make k8s-up` keeps up, as `make k8s-test STEPS=...` runs them on a fresh one. The
# held guest picks the request up between its checks (k8s/run-ID.request on the results share),
# runs the stories and `cleanup` after them, and writes their steps to k8s/run-ID/. The guest's
# lines are printed as they come; the last line counts the steps, and the exit status is 0
# only when every step passed.
#
# Usage: k8s-run.sh UP_DIR STEPS
set -euo pipefail

up=${1:?usage: k8s-run.sh UP_DIR STEPS}
selection=${2:-}
[ -n "${selection// /}" ] || { echo "k8s-run: name the stories with STEPS=... (make k8s-test's stories: core installer affinity seed nri)" >&2; exit 2; }
# The longest a run may take: the installer's story is about 10 minutes under TCG.
deadline=$(($(date +%s) + ${K8S_RUN_SECONDS:-3600}))

pid=$(cat "${up}.pid" 2> /dev/null || true)
if [ -z "${pid}" ] || ! kill -0 "${pid}" 2> /dev/null; then
  echo "k8s-run: no cluster is up (make k8s-up first)" >&2
  exit 1
fi
dir=${up}/guest/k8s
[ -e "${dir}/held" ] || { echo "k8s-run: the cluster is not held yet (make k8s-up prints its kubeconfig once it is)" >&2; exit 1; }
[ ! -e "${dir}/release" ] || { echo "k8s-run: the cluster is being released (make k8s-down)" >&2; exit 1; }

# One run at a time: the stories share the cluster's nodes.
exec 9> "${up}.run.lock"
flock -n 9 || { echo "k8s-run: another make k8s-run is running on this cluster" >&2; exit 1; }

id=$(date +%Y%m%d-%H%M%S)
out=${dir}/run-${id}
console=${up}/serial.log
seen=$(wc -l < "${console}" 2> /dev/null || echo 0)
t0=$(date +%s)
printf '%s\n' "${selection//,/ }" > "${dir}/.run-${id}.tmp"
mv "${dir}/.run-${id}.tmp" "${dir}/run-${id}.request"
echo "k8s-run ${id}: ${selection} on the cluster of make k8s-up"

show_console() { # the guest's lines since the last call
  local now
  now=$(wc -l < "${console}" 2> /dev/null || echo "${seen}")
  if [ "${now}" -gt "${seen}" ]; then sed -n "$((seen + 1)),${now}{s/\r$//;/^guest: /p}" "${console}" || true; fi
  seen=${now}
}

while [ ! -e "${out}/done" ]; do
  show_console
  if ! kill -0 "${pid}" 2> /dev/null; then
    echo "k8s-run: the cluster ended during the run (its console: ${console})" >&2
    exit 1
  fi
  if [ "$(date +%s)" -ge "${deadline}" ]; then
    echo "k8s-run: no result after ${K8S_RUN_SECONDS:-3600} s (K8S_RUN_SECONDS); the run goes on in the guest" >&2
    exit 1
  fi
  sleep 2
done
show_console
if [ -s "${out}/error" ]; then
  cat "${out}/error" >&2
  exit 2
fi
passed=$(jq -s 'map(select(.pass)) | length' "${out}/steps.jsonl")
total=$(jq -s 'length' "${out}/steps.jsonl")
jq -r 'select(.pass | not) | "FAIL \(.name): \(.detail)"' "${out}/steps.jsonl"
jq -r '"story \(.story): \(.seconds) s\(if .failed then ", \(.failed) failed" else "" end)"' "${out}/stories.jsonl"
echo "k8s-run: $(($(date +%s) - t0)) s; steps in ${out}/steps.jsonl"
echo "k8s-run: ${passed}/${total} steps pass"
[ "${passed}" = "${total}" ] && [ "${total}" -gt 0 ]
