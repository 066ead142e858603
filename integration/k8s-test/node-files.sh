#!/usr/bin/env bash
# node-files.sh RUN: the node's files the installer may touch, one a line: path, type, and a
# digest of a regular file's content — kata-topo's directory, containerd's configuration and
# the directory it imports, node-problem-detector's directory and the shim links under RUN,
# and the device plugins' directory by name only, without the kubelet's own checkpoint (it
# rewrites it whenever a plugin registers, and makes it when the first one does) and the
# device plugin's instance lock (an empty directory .<socket>.lock, kept on purpose: a plugin
# that removed it on exit would let a second instance lock a new one beside the first's). Run
# on node A by the guest and on node B inside its namespaces, so that the installer's steps
# compare both nodes' files before the install and after the removal the same way.
set -euo pipefail
run=${1:?usage: node-files.sh RUN}
for p in /opt/kata-topo "${run}/containerd.d" "${run}/containerd.toml" "${run}/npd" "${run}/bin"; do
  [ -e "${p}" ] || [ -L "${p}" ] || continue
  find "${p}" -printf '%p %y %m %l\n' | sort | while read -r path type mode link; do
    if [ "${type}" = f ]; then
      echo "${path} f ${mode} $(sha256sum < "${path}" | cut -c 1-16)"
    else
      echo "${path} ${type} ${mode} ${link}"
    fi
  done
done
find /var/lib/kubelet/device-plugins -mindepth 1 ! -name kubelet_internal_checkpoint ! -name '.*.lock' \
  -printf '%p %y\n' 2> /dev/null | sort || true
