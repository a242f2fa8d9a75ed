# Guest test: the kernel's NBD client over TLS, as a homelabber connects a machine on the LAN.
# The host prepends the certificates: /tmp/server (server-cert.pem, server-key.pem, ca-cert.pem)
# and /tmp/client (client-cert.pem, client-key.pem, ca-cert.pem), all of one CA made with
# certtool. tierblk serves /dev/vda on 127.0.0.1 with --tls require --tls-verify-peer; nbd-client
# connects with its certificate (nbd-client keeps the TLS session in a process of its own and hands
# the kernel a plain socket), an ext4 file system made through /dev/nbd0 reads back after a
# reconnect, and a client without TLS, or without a certificate, is refused.
ip link set lo up || fail "ip link set lo up"

step "starting tierblk with --tls require --tls-verify-peer"
tierblk serve --backend file:///dev/vda --export vda --nbd 127.0.0.1:10809 \
	--tls require --tls-certificates /tmp/server --tls-verify-peer 2>/tmp/tierblk.log &
pid=$!
i=0
until grep -q 'msg=serving' /tmp/tierblk.log; do
	i=$((i + 1))
	[ $i -le 300 ] || fail "tierblk did not start serving"
	sleep 0.1
done

connect() {
	nbd-client 127.0.0.1 10809 -N vda /dev/nbd0 -tlshostname localhost -cacertfile /tmp/client/ca-cert.pem \
		-certfile /tmp/client/client-cert.pem -keyfile /tmp/client/client-key.pem || fail "nbd-client connect over TLS"
	i=0
	while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
		i=$((i + 1))
		[ $i -le 100 ] || fail "/dev/nbd0 has no size"
		sleep 0.1
	done
}
disconnect() { nbd-client -d /dev/nbd0 || fail "nbd-client disconnect"; }

step "a client without TLS is refused"
nbd-client 127.0.0.1 10809 -N vda /dev/nbd1 && fail "a plain nbd-client connected to --tls require"
[ "$(cat /sys/block/nbd1/size)" = 0 ] || fail "/dev/nbd1 has a size after a refused connection"

step "a TLS client without a certificate is refused"
nbd-client 127.0.0.1 10809 -N vda /dev/nbd1 -tlshostname localhost -cacertfile /tmp/client/ca-cert.pem -enable-tls &&
	fail "nbd-client without a client certificate connected to --tls-verify-peer"
[ "$(cat /sys/block/nbd1/size)" = 0 ] || fail "/dev/nbd1 has a size after a refused connection"

step "connecting /dev/nbd0 over TLS"
connect
[ "$(blockdev --getsize64 /dev/nbd0)" = "$(blockdev --getsize64 /dev/vda)" ] ||
	fail "/dev/nbd0 size $(blockdev --getsize64 /dev/nbd0) != /dev/vda size"

step "mkfs.ext4 and writing files"
mkfs.ext4 -q -F /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
write_files /mnt
umount /mnt || fail "umount"
disconnect

step "dropping caches and reconnecting over TLS"
sync
echo 3 >/proc/sys/vm/drop_caches
connect
mount -t ext4 /dev/nbd0 /mnt || fail "mount after reconnect"
check_files /mnt "after reconnect over TLS"
umount /mnt || fail "umount after reconnect"
want=$(md5sum </dev/nbd0)
disconnect

step "stopping tierblk"
kill -TERM $pid
wait $pid
rc=$?
cat /tmp/tierblk.log
[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
[ "$(md5sum </dev/vda)" = "$want" ] || fail "/dev/vda differs from what /dev/nbd0 showed"
grep -q 'TLS' /tmp/tierblk.log || fail "tierblk logged nothing about the refused clients"
step "all checks passed"
