#!/usr/bin/env bash
# make k8s: kubelet, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl at the
# k8s.io/kubernetes version this module requires, the CNI plugins bridge, host-local, loopback and
# portmap at the github.com/containernetworking/plugins version cni/go.mod requires (in bin/cni/),
# a one-member etcd (etcd/, over go.etcd.io/etcd/server/v3/embed) and podresources
# (podresources/: the kubelet's PodResources answer as JSON, for recording), built from the
# Go module proxy with the local Go toolchain, pinned by go.sum, into a cache outside the work
# tree (KT_K8S_CACHE, default ~/.cache/kata-topo/k8s): see tools/go-build.sh.
#
# Prints the directory of the binaries on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/go-build.sh
. "${here}/../tools/go-build.sh"

go_build_init k8s "Go 1.26 or newer builds Kubernetes 1.36"
version=$(go_required "${here}" k8s.io/kubernetes)
[ -n "${version}" ] || die "go.mod requires no k8s.io/kubernetes version"

build() {
  say "building kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl ${version}, etcd, podresources and the CNI plugins ${cni_version} with ${go_version}; a first build takes about 8 min on 2 cores and fills 4 GB of Go build cache"
  # The version the upstream build stamps (hack/lib/version.sh), so --version tells the truth.
  local date major minor ldflags pkg
  date=$(go_module_time "k8s.io/kubernetes@${version}")
  major=${version#v}
  major=${major%%.*}
  minor=${version#v*.}
  minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${date}"
  done
  (cd "${here}" && go build -trimpath -ldflags "${ldflags}" -o "$1/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl ./etcd ./podresources)
  mkdir -p "$1/cni"
  local p=github.com/containernetworking/plugins
  (cd "${here}/cni" && go build -trimpath -ldflags "-s -w -X ${p}/pkg/utils/buildversion.BuildVersion=${cni_version}" \
    -o "$1/cni/" ${p}/plugins/main/bridge ${p}/plugins/ipam/host-local \
    ${p}/plugins/main/loopback ${p}/plugins/meta/portmap)
}

cni_version=$(go_required "${here}/cni" github.com/containernetworking/plugins)
[ -n "${cni_version}" ] || die "cni/go.mod requires no github.com/containernetworking/plugins version"
bins=(kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl etcd podresources
  cni/bridge cni/host-local cni/loopback cni/portmap)
go_cached_build "${KT_K8S_CACHE:-$(go_cache_root)/k8s}" "${version}" "${bins[*]}" build \
  "${here}/go.mod" "${here}/go.sum" "${here}/cni/go.mod" "${here}/cni/go.sum" "${here}/build.sh" "${here}"/etcd/*.go "${here}"/podresources/*.go
for b in "${bins[@]}"; do
  case "${b}" in
    kubectl) v=$("${go_build_out}/bin/${b}" version --client 2> /dev/null | sed -n 1p) || v="" ;;
    cni/*) v=$(env -u CNI_COMMAND "${go_build_out}/bin/${b}" < /dev/null 2>&1 | sed -n 1p) || v="" ;;
    *) v=$("${go_build_out}/bin/${b}" --version 2> /dev/null | sed -n 1p) || v="" ;;
  esac
  go_report "${b}" "${v}"
done
echo "${go_build_out}/bin"
