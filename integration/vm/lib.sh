# Helpers for guest test scripts, sourced before /test.sh runs.

# step prints progress to the console, so a failure shows how far the test got.
step() { echo "TIERBLK-VM: $*"; }

# fail reports why the test failed, after the logs of the tierblk daemons (/tmp/tierblk*.log);
# /init turns the non-zero exit into the FAIL marker.
fail() {
	for f in /tmp/tierblk*.log; do
		[ -f "$f" ] && { echo "--- $f"; cat "$f"; }
	done
	echo "TIERBLK-VM-FAIL: $*"
	exit 1
}

# wait_for PATH [SECONDS]: wait until PATH exists (a socket or a device node).
wait_for() {
	i=0
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ "$i" -le $((${2:-30} * 10)) ] || fail "timed out waiting for $1"
		sleep 0.1
	done
}

# serve_nbd_device DEV LOG ARGS...: start `tierblk serve ARGS --nbd-device DEV` in the background,
# its output in LOG and its PID in $pid, and wait until it has attached DEV. (The device's size
# alone does not tell: after a kill -9 the kernel keeps the dead configuration and its size.)
serve_nbd_device() {
	dev=$1 log=$2
	shift 2
	tierblk serve "$@" --nbd-device "$dev" 2>"$log" &
	pid=$!
	i=0
	until grep -q 'kernel device attached' "$log"; do
		kill -0 $pid 2>/dev/null || { cat "$log"; fail "tierblk exited before attaching $dev"; }
		i=$((i + 1))
		[ $i -le 600 ] || { cat "$log"; fail "tierblk did not attach $dev within 60 s"; }
		sleep 0.1
	done
}

# gone PATH: wait up to 20 seconds for PATH (a device node) to disappear.
gone() {
	i=0
	while [ -e "$1" ]; do
		i=$((i + 1))
		[ "$i" -le 200 ] || fail "$1 still exists"
		sleep 0.1
	done
}

# write_files DIR: a file of 8 MiB and eight small ones of random data in DIR, their checksums in
# /tmp/sums for check_files.
write_files() {
	dd if=/dev/urandom of="$1/big" bs=1M count=8 2>/dev/null || fail "write $1/big"
	for i in 1 2 3 4 5 6 7 8; do
		dd if=/dev/urandom of="$1/small$i" bs=4k count=$i 2>/dev/null || fail "write $1/small$i"
	done
	(cd "$1" && md5sum big small*) >/tmp/sums
}

# check_files DIR WHEN: the files of /tmp/sums read back unchanged from DIR.
check_files() {
	(cd "$1" && md5sum -c /tmp/sums) || fail "checksums differ $2"
}

# nbd_sized DEV: wait until the kernel has finished negotiating /dev/DEV: its size shows up.
nbd_sized() {
	i=0
	while [ "$(cat /sys/block/$1/size)" = 0 ]; do
		i=$((i + 1))
		[ $i -le 100 ] || fail "/dev/$1 has no size"
		sleep 0.1
	done
}

# ext4_roundtrip WHAT DEV: through /dev/nbd0, which the caller's connect and disconnect attach and
# detach and which must have the size of DEV (the disk tierblk serves), an ext4 file system and
# files on it must read back after a reconnect with the guest's page cache dropped; WHAT names the
# connection in the messages. Leaves in want the md5 of what /dev/nbd0 showed last, for the
# caller to compare with DEV.
ext4_roundtrip() {
	step "connecting /dev/nbd0 $1"
	connect
	[ "$(blockdev --getsize64 /dev/nbd0)" = "$(blockdev --getsize64 "$2")" ] ||
		fail "/dev/nbd0 size $(blockdev --getsize64 /dev/nbd0) != $2 size"
	step "mkfs.ext4 and writing files"
	mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
	mount -t ext4 /dev/nbd0 /mnt || fail "mount"
	write_files /mnt
	umount /mnt || fail "umount"
	disconnect

	step "dropping caches and reconnecting $1"
	sync
	echo 3 >/proc/sys/vm/drop_caches
	connect
	mount -t ext4 /dev/nbd0 /mnt || fail "mount after reconnect"
	check_files /mnt "after reconnect $1"
	umount /mnt || fail "umount after reconnect"
	want=$(md5sum </dev/nbd0)
	disconnect
}

# stop_and_compare DEV: tierblk ($pid) must exit 0 on SIGTERM, and then DEV hold what /dev/nbd0
# showed last (want, from ext4_roundtrip), read past the guest's page cache.
stop_and_compare() {
	step "stopping tierblk"
	kill -TERM $pid
	wait $pid
	rc=$?
	cat /tmp/tierblk.log
	[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
	echo 3 >/proc/sys/vm/drop_caches
	[ "$(md5sum <"$1")" = "$want" ] || fail "$1 differs from what /dev/nbd0 showed"
}
