#!/usr/bin/env bash
# make promtool: Prometheus's promtool from Debian's `prometheus` package, taken out of the
# package file (apt-get download, dpkg-deb) into target/promtool/<package version>/ — the
# package itself is not installed: its maintainer scripts start a Prometheus server. The alert
# rules' tests run it (make alerts-test).
#
# Why Debian's and not one built from source: building promtool from the Go module proxy took
# 10 minutes of a cold CI run's two cores and 1.4 GB of Go build cache, for a tool the tests only
# use to check and unit-test rule files; bookworm's promtool (2.42) checks the same files with the
# same flags (check rules --lint=all --lint-fatal, test rules). A newer promtool can be given with
# KT_PROMTOOL=PATH.
#
# Prints the path of promtool on its last line.
set -euo pipefail

workspace=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${workspace}/target/promtool
say() { printf 'promtool: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 2
}
for tool in apt-cache apt-get dpkg-deb; do
  command -v "${tool}" > /dev/null || die "${tool} is missing (Debian's apt)"
done

candidate() { apt-cache policy prometheus 2> /dev/null | sed -n 's/^ *Candidate: *//p' | grep -v '(none)' || true; }
version=$(candidate)
if [ -z "${version}" ]; then
  say "apt knows no prometheus package; apt-get update"
  apt-get update -qq || die "apt-get update failed"
  version=$(candidate)
fi
[ -n "${version}" ] || die "apt-cache knows no candidate of the prometheus package"
dir=${cache}/${version}
if [ ! -x "${dir}/promtool" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "${tmp}"' EXIT
  get() { (cd "${tmp}" && apt-get download -q -o APT::Sandbox::User=root "prometheus=${version}") > "${tmp}/apt.log" 2>&1; }
  if ! get; then
    say "apt-get download failed; apt-get update and again"
    apt-get update -qq || die "apt-get update failed"
    get || die "apt-get download prometheus=${version}: $(tail -n 3 "${tmp}/apt.log")"
  fi
  deb=$(find "${tmp}" -maxdepth 1 -name 'prometheus_*.deb' | head -n 1)
  [ -n "${deb}" ] || die "apt-get download left no prometheus .deb"
  dpkg-deb --fsys-tarfile "${deb}" | tar -x -C "${tmp}" ./usr/bin/promtool \
    || die "no usr/bin/promtool in ${deb##*/}"
  # One version in the cache: the one apt names now.
  rm -rf "${cache}"
  mkdir -p "${dir}"
  mv "${tmp}/usr/bin/promtool" "${dir}/promtool"
  say "took promtool out of ${deb##*/}"
fi
say "$("${dir}/promtool" --version 2> /dev/null | sed -n 1p)"
echo "${dir}/promtool"
