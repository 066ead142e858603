#!/usr/bin/env bash
# make promtool: Prometheus's promtool at the github.com/prometheus/prometheus version this
# module requires, built from the Go module proxy with the local Go toolchain, pinned by go.sum,
# into a cache outside the work tree (KT_PROMTOOL_CACHE, default ~/.cache/kata-topo/promtool):
# see tools/go-build.sh. The alert rules' tests run it (make alerts-test).
#
# Prints the path of promtool on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/go-build.sh
. "${here}/../go-build.sh"

go_build_init promtool "Go 1.26.7 or newer builds Prometheus 3.16"
version=$(go_required "${here}" github.com/prometheus/prometheus)
[ -n "${version}" ] || die "go.mod requires no github.com/prometheus/prometheus version"

build() {
  say "building promtool ${version} with ${go_version}; a first build takes about 10 min on 2 cores"
  # The module v0.3MM.P is Prometheus 3.MM.P; stamped as upstream's promu does, so
  # promtool --version tells the truth (the proxy records no revision).
  local minor patch date ldflags pkg=github.com/prometheus/common/version
  minor=${version#v0.3}
  minor=$((10#${minor%%.*}))
  patch=${version##*.}
  date=$(go_module_time "github.com/prometheus/prometheus@${version}")
  date=$(date -u -d "${date}" +%Y%m%d-%H:%M:%S)
  ldflags="-s -w -X ${pkg}.Version=3.${minor}.${patch} -X ${pkg}.BuildDate=${date}"
  ldflags+=" -X ${pkg}.Branch=HEAD -X ${pkg}.BuildUser=kata-topo"
  (cd "${here}" && go build -trimpath -tags netgo -ldflags "${ldflags}" -o "$1/" \
    github.com/prometheus/prometheus/cmd/promtool)
}

go_cached_build "${KT_PROMTOOL_CACHE:-$(go_cache_root)/promtool}" "${version}" promtool build \
  "${here}/go.mod" "${here}/go.sum" "${here}/build.sh"
go_report promtool "$("${go_build_out}/bin/promtool" --version 2> /dev/null | sed -n 1p)"
echo "${go_build_out}/bin/promtool"
