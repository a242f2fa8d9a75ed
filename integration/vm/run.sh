#!/bin/bash
# run.sh boots the test VM once with a guest script and prints its console on stdout.
# The base image comes from prepare.sh (cached); this adds, as a second uncompressed cpio
# archive appended to the initramfs, the tierblk binary at /bin/tierblk and the guest
# script at /test.sh, and any files given with --file, and attaches any number of blank raw
# disks (/dev/vda, /dev/vdb, ...).
#
# Usage: run.sh --script GUEST.sh [--tierblk BIN] [--disk SIZE | --disk-file IMG | --disk-nbd URI]...
#               [--file HOSTPATH:GUESTPATH]... [--timeout SECONDS] [--mem MIB]
#   SIZE is anything truncate(1) takes (64M). Disks are sparse temporary files.
#   IMG is an existing raw image, attached as it is and kept: a second boot on the same
#   disks (after a power cut: killing qemu) passes the same images again.
#   HOSTPATH is copied to GUESTPATH (absolute) in the guest, keeping its mode: a static binary
#   (csi-sanity, a test's client) or a data file.
#   URI is an NBD export (nbd+unix:///?socket=PATH) that qemu attaches: a disk the host serves,
#   such as one with a volatile write cache that a power cut empties.
#   MIB is the guest's RAM in MiB (default 1024): the memory-pressure test boots with 512.
# Exit:  0 when the guest printed "TIERBLK-VM-RESULT: PASS", 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
script="" tierblk="" timeout=300 mem=1024
disks=()
files=()
while [ $# -gt 0 ]; do
	case $1 in
	--script) script=$2; shift 2 ;;
	--tierblk) tierblk=$2; shift 2 ;;
	--disk) disks+=("size:$2"); shift 2 ;;
	--disk-file) disks+=("file:$2"); shift 2 ;;
	--disk-nbd) disks+=("nbd:$2"); shift 2 ;;
	--file) files+=("$2"); shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ -n "$script" ] || { echo "run.sh: --script is required" >&2; exit 2; }
case $mem in '' | *[!0-9]*) echo "run.sh: --mem $mem: want a size in MiB" >&2; exit 2 ;; esac
command -v qemu-system-x86_64 >/dev/null ||
	{ echo "run.sh: qemu-system-x86_64 missing: make deps installs qemu-system-x86" >&2; exit 1; }

base=$("$here/prepare.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/root/bin"
cp "$script" "$work/root/test.sh"
[ -z "$tierblk" ] || cp "$tierblk" "$work/root/bin/tierblk"
for f in ${files[@]+"${files[@]}"}; do
	src=${f%%:*} dst=${f#*:}
	case $dst in /*) ;; *) echo "run.sh: --file $f: GUESTPATH must be absolute" >&2; exit 2 ;; esac
	mkdir -p "$work/root$(dirname "$dst")"
	cp -p "$src" "$work/root$dst"
done
(cd "$work/root" && find . | cpio -o -H newc --quiet) >"$work/overlay.cpio"
# The kernel unpacks concatenated archives in order; an uncompressed one goes first
# because the kernel cannot always find where a gzip member ends (as with early microcode).
cat "$work/overlay.cpio" "$base/base.cpio.gz" >"$work/initrd"

drives=()
for i in "${!disks[@]}"; do
	img=${disks[$i]#file:}
	if [ "${disks[$i]}" != "${disks[$i]#nbd:}" ]; then
		img=${disks[$i]#nbd:}
	elif [ "${disks[$i]}" != "file:$img" ]; then
		img=$work/disk$i.img
		truncate -s "${disks[$i]#size:}" "$img"
	fi
	drives+=(-drive "file=$img,if=virtio,format=raw")
done

# No KVM here: TCG emulation. The guest powers itself off; the timeout is only
# for a guest that hangs. Under TCG with two vCPUs the kernel now and then oopses while it
# patches its own code during boot (an int3 trap, before /init runs): nothing of the test has
# run then and no disk was touched, so such a boot is tried again, up to three times.
for attempt in 1 2 3; do
	timeout --kill-after=10 "$timeout" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m "$mem" \
		-nographic -nic none -no-reboot -kernel "$base/vmlinuz" -initrd "$work/initrd" \
		-append "console=ttyS0 quiet panic=-1" "${drives[@]}" </dev/null | tee "$work/console" ||
		[ "${PIPESTATUS[0]}" != 124 ] || echo "run.sh: the guest did not power off within $timeout seconds"
	if grep -q '^TIERBLK-VM: booted' <(tr -d '\r' <"$work/console") ||
		! grep -qE 'Oops:|Kernel panic' "$work/console"; then
		break
	fi
	echo "run.sh: the guest kernel crashed while booting (attempt $attempt); booting again"
done
grep -q '^TIERBLK-VM-RESULT: PASS' <(tr -d '\r' <"$work/console")
