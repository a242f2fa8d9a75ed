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
	nbd_sized nbd0
}
disconnect() { nbd-client -d /dev/nbd0 || fail "nbd-client disconnect"; }
ext4_roundtrip "" /dev/vda

stop_and_compare /dev/vda
step "all checks passed"
