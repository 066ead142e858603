#!/usr/bin/env bash
# The host's side of make kata-test, sourced by integration/vm-test/run.sh kata-test: real Kata
# behind the wrapper, through Kata's remote hypervisor interface. run.sh builds the vm-test
# machine (kernel, initramfs, QEMU's arguments); here no guest is booted once: the scenario
# (integration/kata-test/steps.sh) runs a private containerd with the kata-topo handler, the
# wrapper delegating to containerd-shim-kata-v2, and kata-topo-remote-hypervisor, which boots
# that machine for each pod at Kata's StartVM (integration/kata-test/guest.sh inside, with the
# real kata-agent).
#
# The scenario holds the machine-wide integration lock (/run/lock/kata-topo-integration.lock)
# for its whole life, as every private containerd of the tests does: containerd and the shims
# put their sockets in /run/containerd/s, which the integration tests' leak checks watch. It
# runs in a mount namespace of its own, with a tmpfs on /run but for containerd's directory:
# what Kata writes under /run (vc, kata-containers) never reaches this host's.
#
# Needs target/kata/ (make kata: Kata's shim, agent and configuration-remote.toml unpacked).
# KT_KATA_CONTAINERD_BIN, a directory with containerd and ctr (containerd 2.x), runs that
# containerd instead of Debian's.
# shellcheck disable=SC2034,SC2154 # the scenario_* variables, out, tmp, say and die are run.sh's
set -euo pipefail

kata_dir=${workspace}/target/kata
kata_containerd_bin=""
if [ -n "${KT_KATA_CONTAINERD_BIN:-}" ]; then
  kata_containerd_bin=$(realpath -e "${KT_KATA_CONTAINERD_BIN}") || die "KT_KATA_CONTAINERD_BIN: no ${KT_KATA_CONTAINERD_BIN}"
  [ -x "${kata_containerd_bin}/containerd" ] || die "no containerd in ${KT_KATA_CONTAINERD_BIN}"
fi
for f in containerd-shim-kata-v2 kata-agent configuration-remote.toml; do
  [ -f "${kata_dir}/${f}" ] || die "${kata_dir}/${f} is missing (make kata unpacks it)"
done
[ -x "${bins}/kata-topo-remote-hypervisor" ] || die "${bins}/kata-topo-remote-hypervisor is missing (make build-all builds it)"
for tool in flock unshare nsenter lstopo-no-graphics; do
  command -v "${tool}" > /dev/null || die "${tool} is missing (make deps installs it)"
done

scenario_not_covered="the VM view (NOT RUN: see not_run); VFIO devices in a Kata pod (containerd resolves /dev/vfio/<group> on the host, which has none, and Kata's remote hypervisor cannot hot-plug: HotplugAddDevice is not implemented); guest NUMA and vCPU pinning (Kata's remote hypervisor sizes and places no VM); the Kubernetes side runs with runc in make k8s-test"

scenario_run() { # ACCEL SECONDS SERIAL APPEND
  local machine=${tmp}/machine.args rc=0 lock=/run/lock/kata-topo-integration.lock
  qemu_args "$1" "$3" "$4" > "${machine}"
  if ! flock -n "${lock}" true 2> /dev/null; then
    say "waiting for the integration lock (${lock}): another private containerd runs"
  fi
  flock "${lock}" setpriv --pdeathsig KILL timeout --kill-after=15 "$2" \
    unshare --mount --propagation private \
    env KT_WORKSPACE="${workspace}" KT_OUT="${out}" KT_MACHINE="${machine}" \
    KT_CONTAINERD_BIN="${kata_containerd_bin}" \
    bash "${workspace}/integration/kata-test/steps.sh" || rc=$?
  return "${rc}"
}

scenario_report() {
  local kata_version agent_version
  kata_version=$("${kata_dir}/containerd-shim-kata-v2" --version 2> /dev/null | sed -n 's/.*version: \([^,]*\), commit: \([0-9a-f]*\).*/\1 (\2)/p')
  agent_version=$("${kata_dir}/kata-agent" --version 2> /dev/null | awk '{print $3}')
  jq -n \
    --arg containerd "$("${kata_containerd_bin:+${kata_containerd_bin}/}containerd" --version 2> /dev/null | awk '{print $3}')" \
    --arg kata "${kata_version}" --arg agent "${agent_version}" \
    --slurpfile not_run <(cat "${out}/host/not-run.json" 2> /dev/null || echo '{"name": "vm-view", "reason": "the scenario did not reach the sandbox"}') \
    --slurpfile timings <(cat "${out}/host/timings.jsonl" 2> /dev/null) \
    '{versions: {containerd: $containerd, "containerd-shim-kata-v2": $kata, "kata-agent": $agent},
      not_run: $not_run, step_seconds: ($timings | map({(.step): .seconds}) | add // {})}'
}
