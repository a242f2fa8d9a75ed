# Guest test: the kernel's NBD client on top of tierblk serving the raw disk /dev/vda.
# A file system made through /dev/nbd0 must read back identically after the device is
# disconnected, the guest's page cache dropped and the device connected again; after a
# SIGTERM tierblk exits 0 and /dev/vda holds exactly what /dev/nbd0 showed.
sock=/tmp/t.sock

step "starting tierblk on /dev/vda"
tierblk serve --backend file:///dev/vda --export vda --nbd unix:$sock 2>/tmp/tierblk.log &
pid=$!
wait_for $sock 30

connect() {
	nbd-client -unix $sock -N vda /dev/nbd0 || fail "nbd-client connect"
	# The size shows up when the kernel has finished negotiating.
	i=0
	while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
		i=$((i + 1))
		[ $i -le 100 ] || fail "/dev/nbd0 has no size"
		sleep 0.1
	done
}
disconnect() { nbd-client -d /dev/nbd0 || fail "nbd-client disconnect"; }

step "connecting /dev/nbd0"
connect
[ "$(blockdev --getsize64 /dev/nbd0)" = "$(blockdev --getsize64 /dev/vda)" ] ||
	fail "/dev/nbd0 size $(blockdev --getsize64 /dev/nbd0) != /dev/vda size"

step "mkfs.ext4 and writing files"
mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
write_files /mnt
umount /mnt || fail "umount"
disconnect

step "dropping caches and reconnecting"
sync
echo 3 >/proc/sys/vm/drop_caches
connect
mount -t ext4 /dev/nbd0 /mnt || fail "mount after reconnect"
check_files /mnt "after reconnect"
umount /mnt || fail "umount after reconnect"
want=$(md5sum </dev/nbd0)
disconnect

step "stopping tierblk"
kill -TERM $pid
wait $pid
rc=$?
cat /tmp/tierblk.log
[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
echo 3 >/proc/sys/vm/drop_caches
[ "$(md5sum </dev/vda)" = "$want" ] || fail "/dev/vda differs from what /dev/nbd0 showed"
step "all checks passed"
