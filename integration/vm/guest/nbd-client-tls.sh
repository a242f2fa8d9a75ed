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
	nbd_sized nbd0
}
disconnect() { nbd-client -d /dev/nbd0 || fail "nbd-client disconnect"; }

step "a client without TLS is refused"
nbd-client 127.0.0.1 10809 -N vda /dev/nbd1 && fail "a plain nbd-client connected to --tls require"
[ "$(cat /sys/block/nbd1/size)" = 0 ] || fail "/dev/nbd1 has a size after a refused connection"

step "a TLS client without a certificate is refused"
nbd-client 127.0.0.1 10809 -N vda /dev/nbd1 -tlshostname localhost -cacertfile /tmp/client/ca-cert.pem -enable-tls &&
	fail "nbd-client without a client certificate connected to --tls-verify-peer"
[ "$(cat /sys/block/nbd1/size)" = 0 ] || fail "/dev/nbd1 has a size after a refused connection"

ext4_roundtrip "over TLS" /dev/vda

stop_and_compare /dev/vda
grep -q 'TLS' /tmp/tierblk.log || fail "tierblk logged nothing about the refused clients"
step "all checks passed"
