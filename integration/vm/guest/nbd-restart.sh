# Guest test: restarts of `tierblk serve --nbd-device /dev/nbd0` (write-back, /dev/vda the backend,
# /dev/vdb the SSD tier) under a mounted ext4 and a writer that fsyncs every file:
#   1. SIGTERM (default --nbd-device-on-stop keep): tierblk exits 0 and /dev/nbd0 stays attached;
#      a new tierblk takes it over (NBD_CMD_RECONFIGURE) and finds its SSD tier warm: a file
#      written before the stop reads back from the SSD tier (its hits in `tierblk stats`, next to
#      nothing read from the backend). The writer saw no error, and every file reads back with
#      its checksum after a remount with the page cache dropped.
#   2. kill -9 under the writer, then a tierblk with another backend: it refuses the device,
#      naming both backend identifiers. The right one replays the SSD tier's run log (the index
#      records the killed process wrote since its last checkpoint, in /run/tierblk) and takes the
#      device over: the writer sees no error, and every fsynced file is intact after a remount.
#   2b. kill -9 with the run log removed: the writes acknowledged in write-back since the last
#      checkpoint may have died with the process, and a FLUSH the new one answered would vouch for
#      them; it releases the device and attaches it anew, and every file synced before the kill
#      is there.
#   3. An export without an SSD tier (nothing acknowledged lives in the process alone) on
#      /dev/nbd1: kill -9 under the writer, and the new tierblk takes the device over; the writer
#      sees no error and its files are intact.
#   4. --nbd-device-on-stop release: SIGTERM releases the device.
starts=0
admin=unix:/tmp/admin.sock

# start_tierblk starts tierblk (write-back, SSD tier) and waits until it has attached /dev/nbd0.
start_tierblk() {
	starts=$((starts + 1))
	serve_log=/tmp/tierblk.$starts.log
	serve_nbd_device /dev/nbd0 $serve_log --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback --admin $admin
}

# took_over_warm: the last tierblk took the device over and found its SSD tier warm.
took_over_warm() {
	grep 'took over the device' $serve_log || { cat $serve_log; fail "tierblk did not take the device over"; }
	warm=$(grep 'SSD tier warm' $serve_log) || { cat $serve_log; fail "the SSD tier is not warm after the restart"; }
	echo "$warm"
	case "$warm" in *"lines=0 "*) fail "the SSD tier came back empty" ;; esac
}

mkdir -p /tmp/meta
step "tierblk --nbd-device /dev/nbd0 (write-back, SSD tier), ext4, a writer that fsyncs every file"
start_tierblk
mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
write_warm /mnt
start_writer
wait_files 5

step "SIGTERM: tierblk exits 0, /dev/nbd0 stays attached; a new tierblk takes it over"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || { cat $serve_log; fail "tierblk exited $rc after SIGTERM"; }
[ "$(cat /sys/block/nbd0/size)" != 0 ] || fail "/dev/nbd0 was released by SIGTERM"
echo "device left: backend $(cat /sys/block/nbd0/backend), pid $(cat /sys/block/nbd0/pid)"
sleep 1
start_tierblk
took_over_warm
wait_files 5

step "the writer saw no error; what was written before the stop reads back from the SSD tier; every file reads back after a remount"
stop_writer
ssd_warm $admin /mnt/warm
check_sums /mnt

step "kill -9 under the writer; a tierblk with another backend refuses the device; the right one replays its run log and takes it over"
mount -t ext4 /dev/nbd0 /mnt || fail "mount before the kill"
start_writer
wait_files 5
kill -9 $pid
wait $pid
timeout 60 tierblk serve --backend mem://256MiB --nbd-device /dev/nbd0 2>/tmp/other.log
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat /tmp/other.log; fail "the tierblk with another backend exited $rc, want an error"; }
grep 'is attached to another export' /tmp/other.log || { cat /tmp/other.log; fail "no clear refusal from the tierblk with another backend"; }
[ "$(cat /sys/block/nbd0/size)" != 0 ] || fail "the refused tierblk released /dev/nbd0"
start_tierblk
took_over_warm
grep "replayed the last run's log" $serve_log || echo "(the run log held nothing since the last checkpoint)"
! grep -i 'run log.*cannot be used\|no run log' $serve_log || { cat $serve_log; fail "the run log was not used"; }
wait_files 5
stop_writer
check_sums /mnt
echo "write-back: every fsynced file is intact after kill -9 and a take-over"

step "kill -9 with the run log removed: the write-back device is released and attached anew"
mount -t ext4 /dev/nbd0 /mnt || fail "mount before the second kill"
umount /mnt || fail "umount before the second kill"
kill -9 $pid
wait $pid
rm -f /run/tierblk/runlog-*
start_tierblk
grep 'did not stop cleanly' $serve_log || { cat $serve_log; fail "the write-back device was not released after the kill"; }
! grep 'took over the device' $serve_log || fail "a device left by a killed write-back tierblk without its run log was taken over"
mount -t ext4 /dev/nbd0 /mnt || fail "mount after the kill"
(cd /mnt && md5sum -c /tmp/wsums >/tmp/check.out) || { grep -v ': OK' /tmp/check.out; fail "fsynced files differ after the kill"; }
umount /mnt || fail "umount"
echo "write-back without a run log: every file synced before the kill is there after a fresh attach"
kill -TERM $pid
wait $pid || { cat $serve_log; fail "tierblk exited $? after SIGTERM"; }

step "no SSD tier, /dev/nbd1: kill -9 under the writer; the new tierblk takes the device over"
dd if=/dev/zero of=/tmp/ram-backend.img bs=1M count=96 2>/dev/null
ram_start() {
	starts=$((starts + 1))
	serve_log=/tmp/tierblk.$starts.log
	serve_nbd_device /dev/nbd1 $serve_log --backend file:///tmp/ram-backend.img --ram 16MiB
}
ram_start
mkfs.ext4 -q -F /dev/nbd1 || fail "mkfs.ext4 /dev/nbd1"
mount -t ext4 /dev/nbd1 /mnt || fail "mount /dev/nbd1"
start_writer
wait_files 5
kill -9 $pid
wait $pid
ram_start
grep 'took over the device' $serve_log || { cat $serve_log; fail "tierblk did not take /dev/nbd1 over"; }
wait_files 5
stop_writer
check_sums /mnt
kill -TERM $pid
wait $pid || { cat $serve_log; fail "tierblk exited $? after SIGTERM"; }

step "/dev/nbd0, stopped cleanly after the fresh attach: taken over"
start_tierblk
took_over_warm

step "nbd-device-on-stop release: SIGTERM releases the device"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || { cat $serve_log; fail "tierblk exited $rc after SIGTERM"; }
serve_nbd_device /dev/nbd0 /tmp/release.log --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback \
	--nbd-device-on-stop release
kill -TERM $pid
wait $pid || { cat /tmp/release.log; fail "tierblk exited $? after SIGTERM"; }
[ "$(cat /sys/block/nbd0/size)" = 0 ] || fail "/dev/nbd0 still attached after a stop with release"
step "all checks passed"
