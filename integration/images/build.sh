#!/usr/bin/env bash
# Builds the two OCI image archives the tests and the demo import into containerd, from Debian's
# busybox-static (no registry is reachable): a pause image and a busybox image.
#   build.sh OUTDIR   ->  OUTDIR/pause.tar (localhost/kata-topo/pause:1)
#                         OUTDIR/busybox.tar (localhost/kata-topo/busybox:1)
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
busybox=${BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "build.sh: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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
layer_sha=$(sha256sum "$layer" | cut -d' ' -f1)
layer_size=$(stat -c %s "$layer")

image() { # name ref entrypoint-json
  local name=$1 ref=$2 entry=$3 dir=$work/$1
  mkdir -p "$dir/blobs/sha256"
  cp "$layer" "$dir/blobs/sha256/$layer_sha"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"WorkingDir":"/","Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entry" "$layer_sha" > "$dir/config.json"
  local cfg_sha cfg_size
  cfg_sha=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
  cfg_size=$(stat -c %s "$dir/config.json")
  mv "$dir/config.json" "$dir/blobs/sha256/$cfg_sha"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cfg_sha" "$cfg_size" "$layer_sha" "$layer_size" > "$dir/manifest.json"
  local man_sha man_size
  man_sha=$(sha256sum "$dir/manifest.json" | cut -d' ' -f1)
  man_size=$(stat -c %s "$dir/manifest.json")
  mv "$dir/manifest.json" "$dir/blobs/sha256/$man_sha"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$dir/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
    "$man_sha" "$man_size" "$ref" > "$dir/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf "$out/$name.tar" oci-layout index.json blobs
}

# The pause container sleeps until told to stop.
image pause localhost/kata-topo/pause:1 '["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]'
image busybox localhost/kata-topo/busybox:1 '["/bin/sh"]'
echo "built $out/pause.tar $out/busybox.tar"
