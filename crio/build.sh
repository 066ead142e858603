#!/usr/bin/env bash
# make crio: CRI-O (crio), its image copier (copyimg: an OCI archive into CRI-O's
# containers/storage, as CRI-O's own tests fill it without a registry) and pinns (the C helper
# that pins a pod's namespaces) at the github.com/cri-o/cri-o version this module requires,
# built from the Go module proxy with the local Go toolchain, pinned by go.sum, into a cache
# outside the work tree (KT_CRIO_CACHE, default ~/.cache/kata-topo/crio): see tools/go-build.sh.
#
# Static and without cgo: the tags leave out what needs C libraries (gpgme: Go's openpgp
# instead; btrfs, devicemapper, ostree: not built; seccomp: not built, so CRI-O applies no
# seccomp profile). pinns is CRI-O's own C source from the module, built static with cc.
# conmon (Debian's package) and runc are not built here.
#
# Prints the directory of the binaries on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/go-build.sh
. "${here}/../tools/go-build.sh"

go_build_init crio "Go 1.24 or newer builds CRI-O 1.34"
command -v cc > /dev/null || die "no cc on PATH (pinns is C)"
module=github.com/cri-o/cri-o
version=$(go_required "${here}" "${module}")
[ -n "${version}" ] || die "go.mod requires no ${module} version"
tags="containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper btrfs_noversion"

build() {
  say "building crio, copyimg and pinns ${version} with ${go_version}; a first build takes about 5 min on 2 cores"
  local date src
  date=$(go_module_time "${module}@${version}")
  (cd "${here}" && go build -trimpath -tags "${tags}" \
    -ldflags "-s -w -X ${module}/internal/version.buildDate=${date}" \
    -o "$1/" "${module}/cmd/crio" "${module}/test/copyimg")
  # The module's pinns/Makefile, its flags, without make.
  src=$(cd "${here}" && go list -m -f '{{.Dir}}' "${module}")/pinns/src
  cc -std=c99 -Os -O3 -Wall -Werror -Wextra -static -o "$1/pinns" "${src}"/*.c
  strip -s "$1/pinns"
}

bins=(crio copyimg pinns)
go_cached_build "${KT_CRIO_CACHE:-$(go_cache_root)/crio}" "${version}" "${bins[*]}" build \
  "${here}/go.mod" "${here}/go.sum" "${here}/build.sh"
for b in "${bins[@]}"; do
  case "${b}" in
    crio) v=$("${go_build_out}/bin/${b}" --version 2> /dev/null | sed -n 1p) || v="" ;;
    copyimg) v=$("${go_build_out}/bin/${b}" --version 2> /dev/null | sed -n 1p) || v="" ;;
    pinns) v="(CRI-O ${version}'s pinns/src)" ;;
  esac
  go_report "${b}" "${v}"
done
echo "${go_build_out}/bin"
