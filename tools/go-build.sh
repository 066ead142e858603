#!/usr/bin/env bash
# What make k8s (k8s/build.sh) builds its Go commands with: Go commands
# built from the Go module proxy with the local Go toolchain (GOTOOLCHAIN=local), pinned by the
# module's go.sum (-mod=readonly: a go.sum that does not match fails the build instead of being
# rewritten), static and -trimpath, into a cache outside the work tree keyed by everything that
# decides them (the module's files, the build script, this file, the Go version), so a second
# run, another clone or CI on the same machine builds nothing. Go's own caches stay where Go
# keeps them (GOMODCACHE, GOCACHE).
#
# A build script sources this file, calls go_build_init, then go_cached_build with a function
# that builds into a directory; go_build_out is then the set's directory (binaries in bin/).
set -euo pipefail

export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
go_build_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
go_build_tag=go
go_version=
go_build_out=

say() { printf '%s: %s\n' "${go_build_tag}" "$*" >&2; }
die() {
  say "error: $*"
  exit 2
}

# go_build_init TAG WHY: the tag every line starts with; WHY says which Go is needed.
go_build_init() {
  go_build_tag=$1
  command -v go > /dev/null || die "no go on PATH ($2)"
  go_version=$(go env GOVERSION)
}

# go_cache_root: where the sets live, ~/.cache/kata-topo by default.
go_cache_root() { printf '%s\n' "${XDG_CACHE_HOME:-${HOME}/.cache}/kata-topo"; }

# go_required MODULE_DIR MODULE_PATH: the version of MODULE_PATH that MODULE_DIR/go.mod requires.
go_required() {
  awk -v m="$2" '$1 == "require" { $1 = "" ; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$1/go.mod"
}

# go_module_time MODULE@VERSION: the time the proxy records for that version (a build date
# that does not change from one build to the next).
go_module_time() {
  local t
  t=$(go mod download -json "$1" | sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' | head -n 1)
  printf '%s\n' "${t:-1970-01-01T00:00:00Z}"
}

# go_cached_build CACHE NAME "BIN..." BUILDER INPUT...: the set NAME (a version) of the binaries
# BIN, in CACHE/NAME-<go version>-<key of the INPUT files, this file and the Go version>.
# BUILDER DIR builds them into DIR, only when the set is not complete; the sets in CACHE no run
# has used for a day are then removed. Says what it built and how long it took.
go_cached_build() {
  local cache=$1 name=$2 builder=$4 key started b
  local -a bins
  read -r -a bins <<< "$3"
  shift 4
  key=$( (cat "$@" "${go_build_lib}" && printf '%s\n' "${go_version}") | sha256sum | cut -c1-16)
  go_build_out=${cache}/${name}-${go_version}-${key}
  # One build of a cache at a time: a second clone (or CI) on the same machine waits for the
  # first and then finds the set complete, instead of removing the directory it builds into.
  mkdir -p "${cache}"
  exec {go_build_lock}> "${cache}.lock"
  if ! flock -n "${go_build_lock}"; then
    say "waiting for another build of ${cache} to finish"
    flock "${go_build_lock}"
  fi
  if go_set_complete "${bins[@]}"; then
    say "nothing to build: ${name} (${go_version}) is in ${go_build_out}/bin"
    touch "${go_build_out}"
    return 0
  fi
  started=$(date +%s)
  rm -rf "${go_build_out}.tmp"
  mkdir -p "${go_build_out}.tmp/bin"
  "${builder}" "${go_build_out}.tmp/bin"
  touch "${go_build_out}.tmp/built"
  rm -rf "${go_build_out}"
  mv "${go_build_out}.tmp" "${go_build_out}"
  # Older sets are removed once nothing has used them for a day: another clone's run may
  # still be using one (a k8s-test guest has it mounted), and removing it under the run
  # breaks every command it starts next.
  find "${cache}" -mindepth 1 -maxdepth 1 -type d ! -path "${go_build_out}" -mmin +1440 -exec rm -rf {} +
  say "built ${bins[*]} ${name} with ${go_version} in $(($(date +%s) - started)) s"
  go_set_complete "${bins[@]}" || die "the build left no complete set in ${go_build_out}"
}

go_set_complete() {
  [ -f "${go_build_out}/built" ] || return 1
  local b
  for b in "$@"; do [ -x "${go_build_out}/bin/${b}" ] || return 1; done
}

# go_report BIN VERSION_LINE: one line per binary, its size and what it says its version is.
go_report() {
  say "$(printf '%-15s %4s MB  %s' "$1" "$(($(stat -c %s "${go_build_out}/bin/$1") / 1000000))" "$2")"
}
