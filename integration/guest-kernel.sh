#!/usr/bin/env bash
# Writes an uncompressed ELF vmlinux with a PVH entry note to OUT: the guest kernel the
# cloud-hypervisor tests boot (cloud-hypervisor loads only ELF kernels).
#
#   integration/guest-kernel.sh OUT
#
# It downloads Debian's current linux-image-6.1 package with `apt-get download` (the package
# registry, nothing else), takes /boot/vmlinuz-* (a bzImage) out of it and decompresses the
# payload that follows the first compression magic that yields an ELF file, the way the
# kernel's scripts/extract-vmlinux does. Run by `make vmlinux`, which caches the result.
set -euo pipefail

out=${1:?usage: guest-kernel.sh OUT}
work=$(mktemp -d "${TMPDIR:-/tmp}/kata-topo-vmlinux.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The versioned package the meta package points at, e.g. linux-image-6.1.0-57-amd64.
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
	awk '$1 == "Depends:" && $2 ~ /^linux-image-6\.1\./ { print $2; exit }')
if [ -z "$pkg" ]; then
	echo "guest-kernel.sh: apt knows no linux-image-6.1 package (run apt-get update)" >&2
	exit 1
fi
# Into a private directory, so as root rather than as _apt.
(cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "$pkg")
deb=$(find "$work" -maxdepth 1 -name '*.deb' -print -quit)
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" --wildcards './boot/vmlinuz-*'
img=$(find "$work/boot" -name 'vmlinuz-*' -print -quit)

is_pvh_elf() {
	[ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] &&
		readelf -n "$1" 2>/dev/null | grep -q 'Xen.*0x00000012'
}

# magic (as a grep -P byte pattern) and the decompressor for what follows it.
try() {
	local magic=$1
	shift
	local offset
	while read -r offset; do
		# A decompressor reports the kernel's trailing data as an error: only the
		# output counts.
		tail -c +"$((offset + 1))" "$img" | "$@" >"$work/vmlinux" 2>/dev/null || true
		if is_pvh_elf "$work/vmlinux"; then
			mkdir -p "$(dirname "$out")"
			mv "$work/vmlinux" "$out"
			echo "guest kernel: $out (from $pkg)"
			exit 0
		fi
	done < <(LC_ALL=C grep -obUaP "$magic" "$img" | cut -d: -f1)
}

try '\xfd\x37\x7a\x58\x5a\x00' xz -dc
try '\x28\xb5\x2f\xfd' zstd -dc
try '\x1f\x8b\x08' gzip -dc
try '\x42\x5a\x68' bzip2 -dc
try '\x02\x21\x4c\x18' lz4 -dc
echo "guest-kernel.sh: no ELF kernel with a PVH note inside $img from $pkg" >&2
exit 1
