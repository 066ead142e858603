#!/usr/bin/env bash
# The host's side of make k8s-record: the control plane of make k8s-test (etcd and
# kube-apiserver on the host's loopback, one port forwarded into the guest), unchanged.
# shellcheck disable=SC2034,SC2154 # the scenario_* variables and workspace are run.sh's
set -euo pipefail
# shellcheck source=integration/k8s-test/host.sh
. "${workspace}/integration/k8s-test/host.sh"
scenario_not_covered="a recording run: it checks nothing of kata-topo's, it keeps what the real kubelet answers"
