# Helpers for guest test scripts, sourced before /test.sh runs.

# step prints progress to the console, so a failure shows how far the test got.
step() { echo "TIERBLK-VM: $*"; }

# fail reports why the test failed, after the logs of the tierblk daemons (/tmp/tierblk*.log);
# /init turns the non-zero exit into the FAIL marker.
fail() {
	for f in /tmp/tierblk*.log; do
		[ -f "$f" ] && { echo "--- $f"; cat "$f"; }
	done
	# Their gist again, marked for the summary at the end of make test's output (all a CI log may
	# keep): each log's last errors and warnings, a panic's first line, and its last line.
	for f in /tmp/tierblk*.log; do
		[ -f "$f" ] && { grep -E 'level=(ERROR|WARN)|^(panic|fatal error):' "$f"; tail -n 1 "$f"; } | tail -n 4 | sed "s|^|TIERBLK-VM-LOG: $f: |"
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

# files_written: how many files the writer has finished.
files_written() { wc -l </tmp/wsums; }

# wait_files N: wait until the writer has finished N more files than now.
wait_files() {
	target=$(($(files_written) + $1))
	i=0
	until [ "$(files_written)" -ge $target ]; do
		kill -0 $writer 2>/dev/null || { cat /tmp/writer.err; fail "the writer ended"; }
		i=$((i + 1))
		[ $i -le 1800 ] || fail "the writer made no progress for 180 s"
		sleep 0.1
	done
}

# start_writer writes files of random data into /mnt in a loop, each with conv=fsync, recording
# the checksum of each one whose fsync succeeded, until /tmp/stop appears.
start_writer() {
	rm -f /tmp/stop
	: >/tmp/wsums
	: >/tmp/writer.err
	(
		n=0
		while [ ! -e /tmp/stop ]; do
			n=$((n + 1))
			dd if=/dev/urandom of=/tmp/src bs=64k count=4 2>/dev/null
			dd if=/tmp/src of=/mnt/f$n bs=64k conv=fsync 2>/tmp/dd.err || { cat /tmp/dd.err >>/tmp/writer.err; echo "writing f$n failed" >>/tmp/writer.err; exit 1; }
			echo "$(md5sum </tmp/src | cut -d' ' -f1)  f$n" >>/tmp/wsums
		done
	) &
	writer=$!
}

# stop_writer stops the writer, which must have seen no error.
stop_writer() {
	touch /tmp/stop
	wait $writer
	rc=$?
	[ $rc -eq 0 ] || { cat /tmp/writer.err; fail "the writer failed (exit $rc)"; }
	[ ! -s /tmp/writer.err ] || { cat /tmp/writer.err; fail "the writer printed errors"; }
	echo "writer: $(files_written) files, no error"
}

# check_sums DIR: every file the writer finished reads back from DIR, remounted with the page
# cache dropped, with its checksum; DIR is left unmounted.
check_sums() {
	dev=$(awk -v d="$1" '$2 == d {print $1}' /proc/mounts)
	umount "$1" || fail "umount $1"
	echo 3 >/proc/sys/vm/drop_caches
	mount -t ext4 "$dev" "$1" || fail "mount $dev again"
	(cd "$1" && md5sum -c /tmp/wsums >/tmp/check.out) || { grep -v ': OK' /tmp/check.out; fail "checksums differ"; }
	umount "$1" || fail "umount $1 after the check"
}

# tier_stat ADMIN TIER FIELD: a figure of `tierblk stats --json` from the admin endpoint ADMIN:
# FIELD of the cache tier TIER (ram, ssd), or of the backend's traffic where TIER is backend.
tier_stat() {
	tierblk stats --admin "$1" --json | awk -v tier="\"$2\"" -v field="\"$3\":" '
		$1 == "\"name\":" && $2 ~ "^" tier { found = 1 }
		tier == "\"backend\"" && $1 == "\"backend\":" { found = 1 }
		found && $1 == field { sub(/,$/, "", $2); print $2; exit }'
}

# write_warm DIR: DIR/warm, 8 MiB of random data, synced, its checksum in /tmp/warm.sum, for
# ssd_warm to read after a restart.
write_warm() {
	dd if=/dev/urandom of="$1/warm" bs=1M count=8 2>/dev/null || fail "write $1/warm"
	sync
	(cd "$1" && md5sum warm) >/tmp/warm.sum
}

# ssd_warm ADMIN FILE: FILE, read with the page cache dropped, comes from the SSD tier of the
# tierblk at ADMIN: at least 90 % of its lookups there hit, and the backend reads less than a
# tenth of the file; and it has the checksum of /tmp/warm.sum. After a restart this shows that
# the SSD tier came back warm.
ssd_warm() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	hits=$(tier_stat "$1" ssd hits) misses=$(tier_stat "$1" ssd misses) back=$(tier_stat "$1" backend read_bytes)
	[ -n "$hits" ] && [ -n "$misses" ] && [ -n "$back" ] || { tierblk stats --admin "$1" --json; fail "no SSD tier figures from tierblk stats"; }
	cat "$2" >/dev/null || fail "read $2"
	hits=$(($(tier_stat "$1" ssd hits) - hits)) misses=$(($(tier_stat "$1" ssd misses) - misses))
	back=$(($(tier_stat "$1" backend read_bytes) - back))
	size=$(wc -c <"$2")
	echo "reading $2 ($size bytes): $hits SSD-tier hits, $misses misses, $back bytes read from the backend"
	[ $hits -gt 0 ] && [ $((hits * 10)) -ge $(((hits + misses) * 9)) ] || fail "reads of $2 were not SSD-tier hits ($hits hits, $misses misses)"
	[ $((back * 10)) -lt "$size" ] || fail "reading $2 read $back bytes from the backend: the SSD tier did not serve it"
	(cd "$(dirname "$2")" && md5sum -c /tmp/warm.sum) || fail "$2 differs"
}

# wait_log TEXT [LOG PID]: wait up to 180 seconds for the daemon PID ($pid) to log TEXT in LOG
# ($log): longer than tierblk's own waits for the kernel (2 minutes for a ublk take-back,
# internal/ublk/recovery.go), so that a slow kernel fails tierblk with its own message, not the
# script first.
wait_log() {
	i=0
	until grep -q "$1" "${2:-$log}"; do
		kill -0 "${3:-$pid}" 2>/dev/null || fail "tierblk exited before logging '$1'"
		i=$((i + 1))
		[ $i -le 1800 ] || fail "tierblk did not log '$1'"
		sleep 0.1
	done
}

# nullb NAME MIB NSEC: a memory-backed null_blk device of MIB MiB completing each request NSEC ns
# after it arrives (0: at once); its path in $dev. The script loads configfs and null_blk first.
nullb() {
	d=/sys/kernel/config/nullb/$1
	mkdir "$d" || fail "null_blk $1"
	echo 1 >"$d/memory_backed"
	echo "$2" >"$d/size"
	echo 4096 >"$d/blocksize"
	if [ "$3" -gt 0 ]; then
		echo 2 >"$d/irqmode"
		echo "$3" >"$d/completion_nsec"
	else
		echo 0 >"$d/irqmode"
	fi
	echo 1 >"$d/power" || fail "null_blk $1: power on"
	# The kernel names a device made through configfs after its directory (older ones nullbN).
	dev=/dev/$1
	[ -e /sys/block/$1 ] || dev=/dev/nullb$(cat "$d/index")
	mdev -s
	wait_for "$dev" 10
}
