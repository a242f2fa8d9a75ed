#!/bin/bash
# prepare.sh builds, once, the parts of a test VM that do not change between test runs:
# a Debian cloud kernel and a gzipped base initramfs holding busybox, the kernel modules
# the tests load (nbd, ublk_drv, virtio_blk; null_blk and its configfs, which a test loads
# with its own parameters) and the host tools the guest runs, each with the shared libraries
# ldd lists. Everything is cached under CACHE (default
# <repo>/.cache/vm); a second run only prints the directory.
#
# Usage: prepare.sh [CACHE]        prints the directory holding vmlinuz and base.cpio.gz
# Env:   VM_WITH_FIO=1             also put fio in the image (its libraries add ~80 MB)
#        VM_WITH_CACHES=1          fio, and the kernel's caches with their tools: dm-cache (smq),
#                                  dm-writecache, bcache, dmsetup, make-bcache (bench kernel)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-$here/../../.cache/vm}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

log() { echo "vm/prepare: $*" >&2; }

pick_kernel() {
	apt-cache search --names-only 'linux-image-6.12.*cloud-amd64-unsigned' |
		awk '{print $1}' | sort -V | tail -n 1
}

# The newest Debian 12 cloud kernel with modules for nbd and ublk. apt-cache knows
# nothing before the first 'apt-get update' on a fresh machine.
pkg=$(pick_kernel)
if [ -z "$pkg" ]; then
	log "no kernel package known to apt-cache; running apt-get update"
	apt-get update -qq >&2
	pkg=$(pick_kernel)
fi
[ -n "$pkg" ] || { log "no linux-image-6.12.*-cloud-amd64-unsigned package found"; exit 1; }

tools=(/usr/sbin/nbd-client /usr/sbin/mke2fs /usr/sbin/e2fsck /usr/sbin/resize2fs)
modules=(nbd ublk_drv virtio_blk configfs null_blk)
suffix=""
if [ "${VM_WITH_CACHES:-}" = 1 ]; then
	tools+=(/usr/bin/fio /usr/sbin/dmsetup /usr/sbin/make-bcache)
	modules+=(libcrc32c dm-mod dm-bufio dm-bio-prison dm-persistent-data dm-cache dm-cache-smq dm-writecache bcache)
	suffix="-caches"
elif [ "${VM_WITH_FIO:-}" = 1 ]; then
	tools+=(/usr/bin/fio)
	suffix="-fio"
fi

out=$cache/$pkg$suffix
# The stamp names every input, so changing this script or the tool list rebuilds.
stamp="$(cat "$0" "$here/init" "$here/lib.sh" | sha256sum | cut -c1-16) ${tools[*]} ${modules[*]}"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ]; then
	echo "$out"
	exit 0
fi

log "building $out"
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

debdir=$cache/debs
mkdir -p "$debdir"
if ! ls "$debdir/${pkg}_"*.deb >/dev/null 2>&1; then
	log "downloading $pkg"
	(cd "$work" && apt-get download "$pkg" >&2 2>/dev/null && mv ./*.deb "$debdir/")
fi
dpkg-deb -x "$debdir/${pkg}_"*.deb "$work/kernel"
cp "$work"/kernel/boot/vmlinuz-* "$work/vmlinuz"

root=$work/root
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,mnt,etc,lib/modules,run}
for m in "${modules[@]}"; do
	f=$(find "$work/kernel/lib/modules" -name "$m.ko.xz" | head -n 1)
	[ -n "$f" ] || { log "module $m not in $pkg"; exit 1; }
	xz -dc "$f" >"$root/lib/modules/$m.ko"
done

command -v busybox >/dev/null || { log "busybox missing: make deps installs busybox-static"; exit 1; }
cp "$(command -v busybox)" "$root/bin/busybox"

# Each tool keeps its host path, and each library the path ldd resolves it to, so the
# dynamic loader in the guest finds them exactly where the host would.
for t in "${tools[@]}"; do
	[ -x "$t" ] || { log "$t missing: make deps installs it"; exit 1; }
	mkdir -p "$root$(dirname "$t")"
	cp -L "$t" "$root$t"
	for l in $(ldd "$t" | grep -o '/[^ ]*'); do
		mkdir -p "$root$(dirname "$l")"
		cp -L "$l" "$root$l"
	done
done
ln -s mke2fs "$root/usr/sbin/mkfs.ext4"
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/"
cp "$here/init" "$root/init"
cp "$here/lib.sh" "$root/lib/tierblk-vm.sh"
chmod 755 "$root/init"

(cd "$root" && find . | cpio -o -H newc --quiet | gzip -6) >"$work/base.cpio.gz"
mv "$work/vmlinuz" "$work/base.cpio.gz" "$out/"
echo "$stamp" >"$out/stamp"
log "ready: $(du -sh "$out/base.cpio.gz" | cut -f1) initramfs"
echo "$out"
