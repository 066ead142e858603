#!/usr/bin/env bash
# Builds the OCI image archives the tests and the demo import into containerd, from Debian's
# busybox-static (no registry is reachable): a pause image and a busybox image; with
# --installer, the installer's image (deploy/installer/, and the NRI plugin's DaemonSet,
# deploy/nri/): the kata-topo-installer binary and kata-topo's binaries with the libraries they
# link, nothing else (no shell, no kubectl: the installer does its own API calls, its wait, its
# preStop hook and its nsenter).
#   build.sh OUTDIR   ->  OUTDIR/pause.tar (localhost/kata-topo/pause:1)
#                         OUTDIR/busybox.tar (localhost/kata-topo/busybox:1)
#   build.sh --installer VERSION BINDIR OUTDIR
#                     ->  OUTDIR/installer-VERSION.tar (localhost/kata-topo/installer:VERSION)
# The installer image strips the binaries (symbols and debug information) and stamps VERSION
# into each as the ELF section .kata_topo_image: two images of one build differ as two
# releases would.
set -euo pipefail
installer_version=""
if [ "${1:-}" = --installer ]; then
  [ $# = 4 ] || { echo "usage: build.sh --installer VERSION BINDIR OUTDIR" >&2; exit 2; }
  installer_version=$2 installer_bins=$3
  shift 3
fi
out=${1:?usage: build.sh OUTDIR}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

image() { # name ref entrypoint-json PATH layer.tar...
  local name=$1 ref=$2 entry=$3 path=$4 dir=$work/$1 l sha diff_ids="" layers=""
  shift 4
  mkdir -p "$dir/blobs/sha256"
  for l in "$@"; do
    sha=$(sha256sum "$l" | cut -d' ' -f1)
    cp "$l" "$dir/blobs/sha256/$sha"
    diff_ids="$diff_ids${diff_ids:+,}\"sha256:$sha\""
    layers="$layers${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$sha\",\"size\":$(stat -c %s "$l")}"
  done
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"WorkingDir":"/","Env":["PATH=%s"]},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
    "$entry" "$path" "$diff_ids" > "$dir/config.json"
  local cfg_sha cfg_size
  cfg_sha=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
  cfg_size=$(stat -c %s "$dir/config.json")
  mv "$dir/config.json" "$dir/blobs/sha256/$cfg_sha"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$cfg_sha" "$cfg_size" "$layers" > "$dir/manifest.json"
  local man_sha man_size
  man_sha=$(sha256sum "$dir/manifest.json" | cut -d' ' -f1)
  man_size=$(stat -c %s "$dir/manifest.json")
  mv "$dir/manifest.json" "$dir/blobs/sha256/$man_sha"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$dir/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$man_sha" "$man_size" "$ref" "${ref##*:}" > "$dir/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf "$out/$name.tar" oci-layout index.json blobs
}

if [ -n "$installer_version" ]; then
  ws=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  # Two layers: the shared libraries the binaries link (the same for every version, stored
  # once on a node), then kata-topo's own files.
  common=$work/common
  root=$work/installer
  payload=$root/opt/kata-topo-payload
  mkdir -p "$payload/bin" "$payload/share/node-problem-detector" "$root/usr/local/bin" \
    "$common/run" "$common/tmp" "$common/proc" "$common/sys" "$common/dev" "$common/etc"
  echo "root:x:0:0:root:/:/opt/kata-topo-payload/kata-topo-installer" > "$common/etc/passwd"
  printf '%s\n' "$installer_version" > "$work/version"
  printf '%s' "$installer_version" > "$work/section"
  add_libs() { # ELF: the shared libraries it links, at their paths
    local lib
    for lib in $(ldd "$1" 2> /dev/null | grep -o '/[^ ]*'); do
      [ -e "$common$lib" ] || install -D -m 0755 "$lib" "$common$lib"
    done
  }
  stamp() { # BINARY OUT
    [ -x "$1" ] || { echo "build.sh: no $1" >&2; exit 1; }
    objcopy --strip-all --add-section .kata_topo_image="$work/section" "$1" "$2"
    add_libs "$2"
  }
  for b in containerd-shim-kata-topo-v2 kata-topo kata-topo-hook kata-topo-device-plugin kata-topo-nri; do
    stamp "$installer_bins/$b" "$payload/bin/$b"
  done
  stamp "$installer_bins/kata-topo-installer" "$payload/kata-topo-installer"
  # On PATH in the container: the device plugin's and the NRI plugin's DaemonSets run them from
  # there, and `kubectl exec` into the installer's pod finds kata-topo. (The installer puts on
  # the node only the binaries a node runs itself: kata-topo-nri runs in its own pod.)
  for b in kata-topo kata-topo-device-plugin kata-topo-nri; do
    ln -s "/opt/kata-topo-payload/bin/$b" "$root/usr/local/bin/$b"
  done
  ln -s /opt/kata-topo-payload/kata-topo-installer "$root/usr/local/bin/kata-topo-installer"
  install -m 0644 "$ws/configuration-kata.toml" "$payload/share/configuration-kata-topo.toml"
  install -m 0644 "$ws"/deploy/node-problem-detector/*.json "$payload/share/node-problem-detector/"
  cp "$work/version" "$payload/VERSION"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$common" -cf "$work/common.tar" .
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/installer.tar" .
  image "installer-$installer_version" "localhost/kata-topo/installer:$installer_version" \
    '["/opt/kata-topo-payload/kata-topo-installer","install"]' /usr/local/bin \
    "$work/common.tar" "$work/installer.tar"
  echo "built $out/installer-$installer_version.tar ($(($(stat -c %s "$out/installer-$installer_version.tar") / 1024)) KiB)"
  exit 0
fi

busybox=${BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "build.sh: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
# One rootfs layer: busybox and a symlink per applet.
root=$work/rootfs
mkdir -p "$root/bin" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
echo "root:x:0:0:root:/:/bin/sh" > "$root/etc/passwd"
layer=$work/layer.tar
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$layer" .

# The pause container sleeps until told to stop.
image pause localhost/kata-topo/pause:1 '["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]' /bin "$layer"
image busybox localhost/kata-topo/busybox:1 '["/bin/sh"]' /bin "$layer"
echo "built $out/pause.tar $out/busybox.tar"
