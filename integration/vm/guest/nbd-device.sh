# Guest test: `tierblk serve --nbd-device /dev/nbd0` attaches the kernel's NBD client itself
# (generic netlink, no nbd-client), in write-back mode with /dev/vda as the backend and /dev/vdb as
# the SSD tier.
#   0. A second tierblk asking for the same device is refused: it is in use.
#   1. ext4 on /dev/nbd0: files read back identically after unmount, drop_caches and mount.
#   2. SIGTERM with --nbd-device-on-stop release: tierblk exits 0 and the kernel has released
#      /dev/nbd0 (size 0); a new tierblk attaches again and the files are still there. (The
#      default, keep, is nbd-restart.sh's.)
#   3. fio writes 4 KiB blocks at random, 32 in flight, then verifies them (crc32c).
#   4. A second daemon (RAM backend and tier) attaches /dev/nbd1 at the same time.
#   5. kill -9 with --nbd-device-timeout 3s: I/O on /dev/nbd0 fails once the timeouts have passed
#      instead of hanging, both the I/O in flight at the kill and new I/O; a new tierblk replays
#      the SSD tier's run log (what the killed process acknowledged in write-back since its last
#      checkpoint) and takes the device over, and the last durable write is there. (With the run
#      log gone it releases the device instead: nbd-restart.sh.)
starts=0

# start_tierblk [ARGS...] starts tierblk with ARGS too and waits until it has attached /dev/nbd0.
start_tierblk() {
	starts=$((starts + 1))
	serve_log=/tmp/tierblk.$starts.log
	serve_nbd_device /dev/nbd0 $serve_log --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback "$@"
	[ "$(blockdev --getsize64 /dev/nbd0)" = "$(blockdev --getsize64 /dev/vda)" ] ||
		fail "/dev/nbd0 size $(blockdev --getsize64 /dev/nbd0) != /dev/vda size $(blockdev --getsize64 /dev/vda)"
}

# stop_tierblk: SIGTERM must detach the device and exit 0 (tierblk started with
# --nbd-device-on-stop release).
stop_tierblk() {
	kill -TERM $pid
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || { cat $serve_log; fail "tierblk exited $rc after SIGTERM"; }
	[ "$(cat /sys/block/nbd0/size)" = 0 ] ||
		fail "/dev/nbd0 still has $(cat /sys/block/nbd0/size) sectors after tierblk stopped"
}

mkdir -p /tmp/meta

step "starting tierblk --nbd-device /dev/nbd0 (write-back)"
start_tierblk --nbd-device-on-stop release
[ "$(cat /sys/block/nbd0/queue/write_cache)" = "write back" ] ||
	fail "/dev/nbd0 write_cache is '$(cat /sys/block/nbd0/queue/write_cache)': the kernel did not get the FLUSH flag"

step "a second tierblk cannot take /dev/nbd0 while the first serves it"
timeout 60 tierblk serve --backend mem://64MiB --nbd-device /dev/nbd0 2>/tmp/second.log
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat /tmp/second.log; fail "the second tierblk exited $rc, want an error"; }
grep -q '/dev/nbd0 is in use' /tmp/second.log || { cat /tmp/second.log; fail "the second tierblk did not say /dev/nbd0 is in use"; }

step "mkfs.ext4, writing files, remounting after drop_caches"
mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
write_files /mnt
umount /mnt || fail "umount"
echo 3 >/proc/sys/vm/drop_caches
mount -t ext4 /dev/nbd0 /mnt || fail "mount again"
check_files /mnt "after remount"
umount /mnt || fail "umount after remount"

step "SIGTERM (--nbd-device-on-stop release): device released, exit 0; attaching again"
stop_tierblk
start_tierblk --nbd-device-timeout 3s
mount -t ext4 /dev/nbd0 /mnt || fail "mount after restart"
check_files /mnt "after a restart of tierblk"
umount /mnt || fail "umount after restart"

step "fio: random 4 KiB writes, iodepth 32, then crc32c verify"
fio --name=nbd-device --filename=/dev/nbd0 --direct=1 --ioengine=libaio --iodepth=32 \
	--rw=randwrite --bs=4k --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 \
	--eta=never --output=/tmp/fio.out || { cat /tmp/fio.out; fail "fio verify failed"; }
grep -E 'IOPS|err=' /tmp/fio.out

step "meanwhile a second daemon: RAM backend, write-through RAM tier, /dev/nbd1"
tierblk serve --backend mem://64MiB --ram 16MiB --nbd-device /dev/nbd1 --nbd-device-on-stop release 2>/tmp/nbd1.log &
pid1=$!
i=0
until grep -q 'kernel device attached' /tmp/nbd1.log; do
	kill -0 $pid1 2>/dev/null || { cat /tmp/nbd1.log; fail "the /dev/nbd1 tierblk exited before attaching"; }
	i=$((i + 1))
	[ $i -le 600 ] || { cat /tmp/nbd1.log; fail "/dev/nbd1 not attached within 60 s"; }
	sleep 0.1
done
dd if=/dev/urandom of=/tmp/rand bs=1M count=4 2>/dev/null
dd if=/tmp/rand of=/dev/nbd1 bs=1M seek=3 oflag=direct 2>/dev/null || fail "write /dev/nbd1"
[ "$(dd if=/dev/nbd1 bs=1M skip=3 count=4 iflag=direct 2>/dev/null | md5sum)" = "$(md5sum </tmp/rand)" ] ||
	fail "/dev/nbd1 reads back something else"
kill -TERM $pid1
wait $pid1
rc=$?
[ $rc -eq 0 ] || { cat /tmp/nbd1.log; fail "the /dev/nbd1 tierblk exited $rc after SIGTERM"; }
[ "$(cat /sys/block/nbd1/size)" = 0 ] || fail "/dev/nbd1 not released"

step "kill -9 with I/O in flight (dead-connection timeout 3 s): I/O fails, no hang"
yes durable | head -c 4096 >/tmp/durable
dd if=/tmp/durable of=/dev/nbd0 bs=4096 seek=1000 count=1 oflag=direct conv=notrunc,fsync 2>/dev/null ||
	fail "durable write before the kill"
timeout 120 dd if=/dev/urandom of=/dev/nbd0 bs=64k seek=1024 count=100000 oflag=direct 2>/tmp/bg.err &
bg=$!
sleep 2
kill -0 $bg 2>/dev/null || { cat /tmp/bg.err; fail "the background writer ended before the kill"; }
kill -9 $pid
wait $pid
wait $bg
rc=$?
[ $rc -ne 124 ] || fail "writes in flight at the kill hung for 120 s"
[ $rc -ne 0 ] || fail "the background writer succeeded although tierblk was killed"
echo "background writer: exit $rc: $(tail -n 3 /tmp/bg.err | tr '\n' ' ')"
timeout 60 dd if=/dev/nbd0 of=/dev/null bs=4096 count=1 skip=5000 iflag=direct 2>/dev/null
rc=$?
[ $rc -ne 124 ] || fail "a read after the kill hung for 60 s"
[ $rc -ne 0 ] || fail "a read after the kill succeeded"
echo "read after the kill: exit $rc"

step "a new tierblk replays the killed one's run log and takes its write-back device over"
start_tierblk --nbd-device-on-stop release
[ "$(dd if=/dev/nbd0 bs=4096 skip=1000 count=1 iflag=direct 2>/dev/null | md5sum)" = "$(md5sum </tmp/durable)" ] ||
	fail "the durable write before the kill is lost"
grep -q "replayed the last run's log" $serve_log || { cat $serve_log; fail "tierblk did not replay the killed tierblk's run log"; }
grep -q 'took over the device' $serve_log || { cat $serve_log; fail "tierblk did not take over the device after replaying the run log"; }
stop_tierblk
step "all checks passed"
