#!/usr/bin/env bash
# Moves k8s/go.mod to another Kubernetes release: k8s.io/kubernetes at VERSION and each of its
# staging modules (the ones its own go.mod replaces by ./staging/…) at their published
# v0.MINOR.PATCH, then go mod tidy through the module proxy. make k8s then builds it.
#
#   bash k8s/set-version.sh v1.37.2
set -euo pipefail

version=${1:-}
[[ "${version}" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "usage: set-version.sh v1.MINOR.PATCH" >&2; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
staging=v0.${version#v1.}
gomod=$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": *"\([^"]*\)".*/\1/p')
[ -f "${gomod}" ] || { echo "set-version.sh: the module proxy has no k8s.io/kubernetes ${version}" >&2; exit 2; }
for old in $(go mod edit -json | jq -r '.Replace // [] | .[].Old.Path'); do
  go mod edit -dropreplace="${old}"
done
go mod edit -require="k8s.io/kubernetes@${version}"
while read -r module; do
  go mod edit -replace="${module}=${module}@${staging}"
done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "${gomod}")
go mod tidy
echo "k8s/go.mod: k8s.io/kubernetes ${version}, staging modules ${staging}; make k8s builds it"
