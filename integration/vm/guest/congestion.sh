# Guest test: an SSD tier on a congested device. null_blk, memory-backed so that it keeps what is
# written to it, stands in for an SSD that takes 20 ms a request; the backend is /dev/vda, served
# through ublk in write-through.
#   1. Random 4 KiB reads (fio, 16 in flight): the kernel's counters of /dev/nullb0 show requests
#      of about 20 ms, and the SSD tier turns missed lines away while it is congested
#      (`tierblk stats`: congested > 0, device_latency_seconds >= 0.01).
#   2. Every byte read through /dev/ublkb0 is the backend's.
log=/tmp/tierblk.log
admin=unix:/tmp/admin.sock

step "null_blk: a memory-backed device of 20 ms a request"
insmod /lib/modules/configfs.ko || fail "insmod configfs"
insmod /lib/modules/null_blk.ko nr_devices=1 gb=1 memory_backed=1 queue_mode=2 irqmode=2 \
	completion_nsec=20000000 || fail "insmod null_blk"
wait_for /dev/nullb0 10

step "backend: 64 MiB of random data on /dev/vda"
dd if=/dev/urandom of=/dev/vda bs=1M count=64 conv=fsync 2>/dev/null || fail "dd to /dev/vda"

tierblk serve --backend file:///dev/vda --ssd /dev/nullb0 --meta /tmp/meta --ublk \
	--admin $admin 2>>$log &
pid=$!
wait_for /dev/ublkb0 60

step "fio: random 4 KiB reads over 64 MiB, 16 in flight"
fio --name=cold --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --iodepth=16 --rw=randread \
	--bs=4k --size=64M --number_ios=3000 --output=/tmp/fio.out || { cat /tmp/fio.out; fail "fio"; }
grep -E 'read:|err=' /tmp/fio.out
tierblk stats --admin $admin
tierblk stats --admin $admin --json >/tmp/stats.raw || fail "tierblk stats --json"
tr -d ' \n' </tmp/stats.raw >/tmp/stats.json
congested=$(grep -o '"congested":[0-9]*' /tmp/stats.json | head -n 1 | cut -d: -f2)
latency=$(grep -o '"device_latency_seconds":[0-9.e-]*' /tmp/stats.json | head -n 1 | cut -d: -f2)
step "missed lines refused for congestion: ${congested:-none}; device latency: ${latency:-none} s"
[ "${congested:-0}" -gt 0 ] || fail "the SSD tier on a 20 ms device refused no line for congestion"
awk -v l="${latency:-0}" 'BEGIN { exit !(l >= 0.01) }' || fail "device latency ${latency:-none} s, want at least 0.01"

step "every byte read through /dev/ublkb0 is the backend's"
want=$(head -c 64M /dev/vda | md5sum | cut -d' ' -f1)
got=$(head -c 64M /dev/ublkb0 | md5sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "/dev/ublkb0 reads $got, /dev/vda $want"

kill -TERM $pid
wait $pid || fail "tierblk exited $? after SIGTERM"
