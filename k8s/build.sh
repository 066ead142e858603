#!/usr/bin/env bash
# make k8s: kubelet, kube-apiserver and kubectl at the k8s.io/kubernetes version this module
# requires, and a one-member etcd (etcd/, over go.etcd.io/etcd/server/v3/embed), built from the
# Go module proxy with the local Go toolchain, pinned by go.sum (-mod=readonly: a go.sum that
# does not match fails the build instead of being rewritten).
#
# The binaries land in a cache outside the work tree, keyed by everything that decides them
# (go.mod, go.sum, etcd/, this script, the Go version), so a second run, another clone or CI on
# the same machine builds nothing. Go's own caches stay where Go keeps them (GOMODCACHE,
# GOCACHE); set them, and KT_K8S_CACHE, to move all of it.
#
# Prints the directory of the binaries on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${KT_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/kata-topo/k8s}
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

say() { printf 'k8s: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

command -v go > /dev/null || die "no go on PATH (Go 1.26 or newer builds Kubernetes 1.36)"
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "${here}/go.mod")
[ -n "${version}" ] || die "go.mod requires no k8s.io/kubernetes version"
go_version=$(go env GOVERSION)

key=$(cd "${here}" && cat go.mod go.sum build.sh etcd/*.go | sha256sum | cut -c1-16)
out=${cache}/${version}-${go_version}-${key}
bins=(kubelet kube-apiserver kubectl etcd)

complete() {
  [ -f "${out}/built" ] || return 1
  for b in "${bins[@]}"; do [ -x "${out}/bin/${b}" ] || return 1; done
}

if complete; then
  say "nothing to build: ${version} (${go_version}) is in ${out}/bin"
else
  started=$(date +%s)
  say "building kubelet, kube-apiserver, kubectl ${version} and etcd with ${go_version}; a first build takes about 5 min on 2 cores and fills 3 GB of Go build cache"
  # The version the upstream build stamps (hack/lib/version.sh), so --version tells the truth.
  info=$(go mod download -json "k8s.io/kubernetes@${version}")
  date=$(printf '%s' "${info}" | sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' | head -n 1)
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${date:-1970-01-01T00:00:00Z}"
  done
  rm -rf "${out}.tmp"
  mkdir -p "${out}.tmp/bin"
  (cd "${here}" && go build -trimpath -ldflags "${ldflags}" -o "${out}.tmp/bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kubectl ./etcd)
  touch "${out}.tmp/built"
  rm -rf "${out}"
  mv "${out}.tmp" "${out}"
  # Older builds of this cache are of no further use.
  find "${cache}" -mindepth 1 -maxdepth 1 -type d ! -path "${out}" -exec rm -rf {} +
  say "built in $(($(date +%s) - started)) s"
fi
complete || die "the build left no complete set in ${out}"
for b in "${bins[@]}"; do
  case "${b}" in
    kubectl) v=$("${out}/bin/${b}" version --client 2> /dev/null | sed -n 1p) || v="" ;;
    *) v=$("${out}/bin/${b}" --version 2> /dev/null | sed -n 1p) || v="" ;;
  esac
  say "$(printf '%-15s %4s MB  %s' "${b}" "$(($(stat -c %s "${out}/bin/${b}") / 1000000))" "${v}")"
done
echo "${out}/bin"
