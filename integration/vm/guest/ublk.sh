# Guest test: tierblk's ublk device, /dev/ublkb0, serving the write-back cache (backend /dev/vda,
# SSD tier /dev/vdb, metadata in /tmp/meta).
#   1. ext4 made and filled through /dev/ublkb0 reads back identically after an unmount and a
#      dropped page cache;
#   2. fio writes random blocks of mixed sizes (iodepth 32) and verifies them (crc32c);
#   3. SIGTERM: tierblk exits 0 and /dev/ublkb0 and /dev/ublkc0 are gone;
#   4. kill -9 while fio runs: fio's I/O fails (within a timeout, no hang) and the kernel
#      removes /dev/ublkb0;
#   5. SIGTERM with ext4 still mounted: the device is removed all the same and tierblk exits
#      non-zero, saying why;
#   6. without a cache, the backend opened direct (its reads and writes served on the queues'
#      own rings): fio's verify, and ext4 (whose journal writes FUA) read back after a remount.
log=/tmp/tierblk.log

start_tierblk() {
	tierblk serve --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback --ublk "$@" 2>>$log &
	pid=$!
	wait_for /dev/ublkb0 60
}

step "starting tierblk --ublk"
start_tierblk
[ "$(blockdev --getsize64 /dev/ublkb0)" = "$(blockdev --getsize64 /dev/vda)" ] ||
	fail "/dev/ublkb0 has $(blockdev --getsize64 /dev/ublkb0) bytes, /dev/vda $(blockdev --getsize64 /dev/vda)"
# Without a volatile write cache the kernel never sends a flush, and fsync proves nothing.
[ "$(cat /sys/block/ublkb0/queue/write_cache)" = "write back" ] ||
	fail "/dev/ublkb0 write_cache is '$(cat /sys/block/ublkb0/queue/write_cache)', want 'write back'"
[ "$(cat /sys/block/ublkb0/queue/fua)" = 1 ] || fail "/dev/ublkb0 does not take FUA writes"
step "queues: $(ls /sys/block/ublkb0/mq | wc -l), max_sectors_kb $(cat /sys/block/ublkb0/queue/max_sectors_kb)," \
	"discard_max_bytes $(cat /sys/block/ublkb0/queue/discard_max_bytes)," \
	"write_zeroes_max_bytes $(cat /sys/block/ublkb0/queue/write_zeroes_max_bytes)"

step "mkfs.ext4 and writing files"
mkfs.ext4 -q -F /dev/ublkb0 || fail "mkfs.ext4"
mount -t ext4 /dev/ublkb0 /mnt || fail "mount"
write_files /mnt
rm /mnt/small8 || fail "rm small8"
sed -i /small8/d /tmp/sums
if [ "$(cat /sys/block/ublkb0/queue/discard_max_bytes)" -gt 0 ]; then
	fstrim -v /mnt || fail "fstrim"
	# Field 12 of the disk's stat: discard requests completed.
	[ "$(awk '{print $12}' /sys/block/ublkb0/stat)" -gt 0 ] || fail "fstrim sent no discard to /dev/ublkb0"
fi
umount /mnt || fail "umount"

step "dropping caches, mounting again"
echo 3 >/proc/sys/vm/drop_caches
mount -t ext4 /dev/ublkb0 /mnt || fail "mount again"
check_files /mnt "after remount"
umount /mnt || fail "umount again"

step "fio randwrite + verify (crc32c, iodepth 32)"
fio --name=verify --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --iodepth=32 \
	--rw=randwrite --bssplit=4k/50:16k/20:64k/15:1m/15 --size=48M --offset=64M \
	--verify=crc32c --verify_fatal=1 --do_verify=1 --verify_state_save=0 \
	--output=/tmp/fio.out || { cat /tmp/fio.out; fail "fio verify failed"; }
grep -E 'write:|read:|err=' /tmp/fio.out
grep -q 'err= 0' /tmp/fio.out || { cat /tmp/fio.out; fail "fio reported an error"; }

step "SIGTERM"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still exists after tierblk exited"
[ ! -e /dev/ublkc0 ] || fail "/dev/ublkc0 still exists after tierblk exited"

step "kill -9 while fio runs"
start_tierblk
timeout 60 fio --name=killed --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --iodepth=32 \
	--rw=randrw --bs=4k --size=32M --time_based --runtime=600 --output=/tmp/fio-killed.out &
fio_pid=$!
sleep 5
kill -9 $pid
wait $pid
wait $fio_pid
rc=$?
cat /tmp/fio-killed.out
[ $rc -ne 124 ] || fail "fio still ran 60 seconds after tierblk was killed: I/O hangs"
[ $rc -ne 0 ] || fail "fio succeeded although tierblk was killed"
step "fio exited $rc after the kill"
gone /dev/ublkb0
timeout 20 dd if=/dev/ublkb0 of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null
rc=$?
[ $rc -ne 124 ] || fail "a read of /dev/ublkb0 hangs after tierblk was killed"
[ $rc -ne 0 ] || fail "a read of /dev/ublkb0 succeeded after tierblk was killed"

step "SIGTERM with a file system mounted: the device goes, tierblk says so"
# Device 0 is still taken by the stopped device the killed daemon left: this one gets 1.
dev=/dev/ublkb1
tierblk serve --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback --ublk 2>>$log &
pid=$!
wait_for $dev 60
mkfs.ext4 -q -F $dev || fail "mkfs.ext4 $dev"
mount -t ext4 $dev /mnt || fail "mount $dev"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -ne 0 ] || fail "tierblk exited 0 although $dev was mounted when it removed it"
grep -q "still holds $dev open (a mounted file system?)" $log || fail "tierblk did not say that $dev was mounted"
gone $dev
umount /mnt 2>/dev/null || umount -l /mnt

step "no cache, backend direct: requests on the queues' rings"
dev=/dev/ublkb5
tierblk serve --backend "file:///dev/vda?direct=true" --ublk --ublk-id 5 2>>$log &
pid=$!
wait_for $dev 60
fio --name=plain --filename=$dev --direct=1 --ioengine=libaio --iodepth=32 \
	--rw=randrw --bssplit=4k/50:16k/20:64k/15:1m/15 --size=48M --offset=64M \
	--verify=crc32c --verify_fatal=1 --do_verify=1 --verify_state_save=0 \
	--output=/tmp/fio-plain.out || { cat /tmp/fio-plain.out; fail "fio verify failed without a cache"; }
grep -q 'err= 0' /tmp/fio-plain.out || { cat /tmp/fio-plain.out; fail "fio reported an error without a cache"; }
mkfs.ext4 -q -F $dev || fail "mkfs.ext4 $dev"
mount -t ext4 $dev /mnt || fail "mount $dev"
write_files /mnt
umount /mnt || fail "umount $dev"
echo 3 >/proc/sys/vm/drop_caches
mount -t ext4 $dev /mnt || fail "mount $dev again"
check_files /mnt "without a cache, after remount"
umount /mnt || fail "umount $dev again"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 0 ] || fail "tierblk without a cache exited $rc after SIGTERM"
cat $log
step "all checks passed"
