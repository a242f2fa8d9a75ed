# Guest test: ublk user recovery with a fixed device number (--ublk-id 0), over the write-back
# cache (backend /dev/vda, SSD tier /dev/vdb, metadata in /tmp/meta).
#   1. A daemon without --ublk-id is killed: the kernel removes /dev/ublkb0 but keeps the stopped
#      device 0; tierblk --ublk-id 0 deletes it and creates device 0 anew.
#   2. ext4 is mounted on /dev/ublkb0 and tierblk is killed with -9 while a writer fsyncs to it:
#      /dev/ublkb0 stays. A read issued while no daemon runs waits, and is served after the
#      restart.
#   3. tierblk --ublk-id 0 replays the SSD tier's run log (the index records the killed daemon
#      wrote in write-back since its last checkpoint, in /run/tierblk) and takes the device back
#      with no warning: requests in flight at the kill are reissued, so the writer sees no error
#      and its file is whole, what was synced before the kill is intact, and the file system is
#      clean (e2fsck -n) after an unmount.
#   4. An export without an SSD tier (nothing acknowledged lives in the daemon alone), device 1:
#      kill -9 under the writer and --ublk-id 1 takes it back; requests in flight at the kill are
#      reissued, so the writer saw no error and its file is whole; the still mounted
#      file system takes new files, and they survive an unmount and a dropped page cache.
#   5. SIGTERM with --ublk-on-stop remove: tierblk exits 0 and the device is gone.
# Each daemon logs to its own file, /tmp/tierblk.N.log.
n=0

# start_tierblk [ARGS]: start a daemon and wait until its device is up. A kill -9 while the
# kernel is still adding /dev/ublkb0 (START_DEV scans it for partitions, and holds the device's
# lock meanwhile) can hang the daemon's exit on Linux 6.12, so the tests kill only after that.
start_tierblk() {
	n=$((n + 1))
	log=/tmp/tierblk.$n.log
	tierblk serve --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback --ublk "$@" 2>$log &
	pid=$!
	wait_log 'msg="block device"'
}

kill9() {
	kill -9 $pid
	wait $pid
}

# kill_under_writer: a writer copies /tmp/during into /mnt/during block after block, each with an
# fsync, in the background ($writer); three seconds in, the daemon is killed with -9.
kill_under_writer() {
	(
		i=0
		while [ $i -lt 1000 ]; do
			dd if=/tmp/during of=/mnt/during bs=4k skip=$i seek=$i count=1 conv=notrunc,fsync 2>/dev/null ||
				{ echo "TIERBLK-VM: the writer's block $i failed"; exit 1; }
			i=$((i + 1))
		done
	) &
	writer=$!
	sleep 3
	kill -0 $writer 2>/dev/null || step "note: the writer finished before the kill"
	kill9
	sleep 1
}

step "a daemon without --ublk-id, killed, leaves a stopped device 0"
start_tierblk
kill9
gone /dev/ublkb0
[ -e /dev/ublkc0 ] || fail "/dev/ublkc0 is gone too: nothing left for --ublk-id 0 to replace"

step "--ublk-id 0 replaces it"
start_tierblk --ublk-id 0
grep -q "deleting a stopped ublk device" $log || fail "tierblk did not replace the stopped device 0"
# Inode tables and journal written now, so that no background write is in flight at the kill.
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/ublkb0 || fail "mkfs.ext4"
mount -t ext4 /dev/ublkb0 /mnt || fail "mount"
dd if=/dev/urandom of=/mnt/before bs=1M count=8 2>/dev/null || fail "write /mnt/before"
sync
(cd /mnt && md5sum before) >/tmp/sums

step "kill -9 with the file system mounted, while a writer fsyncs block after block"
dd if=/dev/urandom of=/tmp/during bs=4k count=1000 2>/dev/null
kill_under_writer
[ -e /dev/ublkb0 ] || fail "/dev/ublkb0 went away: the device was not left for recovery"
timeout 120 fio --name=gap --filename=/dev/ublkb0 --direct=1 --rw=read --bs=4k --size=4k \
	--output=/tmp/fio-gap.out &
gap=$!
sleep 2

step "restarting with --ublk-id 0"
start_tierblk --ublk-id 0
grep -q "ublk device taken back" $log || fail "tierblk did not take the device back"
wait $gap
rc=$?
cat /tmp/fio-gap.out
[ $rc -ne 124 ] || fail "a read issued while no daemon ran still hangs after the recovery"
[ $rc -eq 0 ] || fail "a read queued while no daemon ran failed after the recovery (fio exited $rc)"

! grep -q "the first flush fails rather than vouch for them" $log || fail "the run log was not replayed: the first flush was distrusted"
! grep -qi 'run log.*cannot be used' $log || fail "the run log of the killed daemon was refused"
wait $writer
rc=$?
# UBLK_F_USER_RECOVERY_REISSUE: what was in flight at the kill ran again on the new daemon.
[ $rc -eq 0 ] || fail "a write to the mounted file system failed across the kill and the recovery (exit $rc)"
cmp /tmp/during /mnt/during || fail "/mnt/during differs from what the writer wrote"
(cd /mnt && md5sum -c /tmp/sums) || fail "/mnt/before, synced before the kill, differs after the recovery"
umount /mnt || fail "umount after the recovery"
e2fsck -fn /dev/ublkb0 >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck found errors on /dev/ublkb0 after the recovery"; }
echo 3 >/proc/sys/vm/drop_caches
mount -t ext4 /dev/ublkb0 /mnt || fail "mount after the recovery"
(cd /mnt && md5sum -c /tmp/sums) || fail "/mnt/before differs after the recovery and a remount"
cmp /tmp/during /mnt/during || fail "/mnt/during differs after the recovery and a remount"
umount /mnt || fail "umount after the remount"
kill -TERM $pid
wait $pid || fail "tierblk exited $? after SIGTERM"

step "no SSD tier, device 1: kill -9 while a writer fsyncs; --ublk-id 1 takes it back"
dd if=/dev/zero of=/tmp/ram-backend.img bs=1M count=96 2>/dev/null
start_ram() {
	n=$((n + 1))
	log=/tmp/tierblk.$n.log
	tierblk serve --backend file:///tmp/ram-backend.img --ram 16MiB --ublk --ublk-id 1 --ublk-on-stop remove 2>$log &
	pid=$!
	wait_log 'msg="block device"'
}
start_ram
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/ublkb1 || fail "mkfs.ext4 /dev/ublkb1"
mount -t ext4 /dev/ublkb1 /mnt || fail "mount /dev/ublkb1"
dd if=/dev/urandom of=/mnt/before bs=1M count=8 2>/dev/null || fail "write /mnt/before"
sync
(cd /mnt && md5sum before) >/tmp/sums
kill_under_writer
[ -e /dev/ublkb1 ] || fail "/dev/ublkb1 went away: the device was not left for recovery"
start_ram
grep -q "ublk device taken back" $log || fail "tierblk did not take device 1 back"
wait $writer
rc=$?
# UBLK_F_USER_RECOVERY_REISSUE: what was in flight at the kill ran again on the new daemon.
[ $rc -eq 0 ] || fail "a write to the mounted file system failed across the kill and the recovery"
cmp /tmp/during /mnt/during || fail "/mnt/during differs from what the writer wrote"

step "the mounted file system works again"
(cd /mnt && md5sum -c /tmp/sums) || fail "/mnt/before differs after the recovery"
dd if=/dev/urandom of=/mnt/after bs=1M count=8 2>/dev/null || fail "write /mnt/after"
(cd /mnt && md5sum after) >>/tmp/sums
umount /mnt || fail "umount"
echo 3 >/proc/sys/vm/drop_caches
mount -t ext4 /dev/ublkb1 /mnt || fail "mount after the recovery"
(cd /mnt && md5sum -c /tmp/sums) || fail "checksums differ after the recovery and a remount"
umount /mnt || fail "umount after the recovery"

step "SIGTERM"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
[ ! -e /dev/ublkb1 ] || fail "/dev/ublkb1 still exists after tierblk exited"
[ ! -e /dev/ublkc1 ] || fail "/dev/ublkc1 still exists after tierblk exited"
cat /tmp/tierblk.*.log
step "all checks passed"
