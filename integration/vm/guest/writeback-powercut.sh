# Guest test: write-back across a power cut. tierblk serves /dev/vdb (the backend) in write-back
# mode with its SSD tier on /dev/vda and the tier's metadata on an ext4 file system on /dev/vdc.
# The host prepends "phase=write" or "phase=check" (and, for check, writes /tmp/expect).
#
# phase=write: /dev/nbd0 gets 4 KiB writes with O_DIRECT, each block holding the text
#   "blk=B seq=S" repeated; some are followed by an fsync (a durable write), some by a flush of
#   the whole device. After each one the guest prints a record, once the kernel has its answer:
#     TIERBLK-WB: written B S | TIERBLK-WB: durable B S | TIERBLK-WB: flushed S
#   and it goes on until the host kills qemu: a power cut.
# phase=check: /tmp/expect holds "B MINSEQ" lines, each block's last durable write. tierblk starts
#   again on the same disks; every block must hold a whole write of that block with seq >= MINSEQ.
#   Then `tierblk flush` writes the dirty lines back and /dev/vdb itself must hold the same.
#   After each of the two checks the guest prints how many blocks it verified, which the host
#   requires to be every block of /tmp/expect and counts (make crash-campaign):
#     TIERBLK-WB: verified nbd0 N | TIERBLK-WB: verified backend N
sock=/tmp/t.sock
admin=unix:/tmp/admin.sock

start_tierblk() {
	mkdir -p /meta
	mount -t ext4 /dev/vdc /meta || fail "mount /dev/vdc (the SSD tier's metadata)"
	tierblk serve --backend file:///dev/vdb --ssd /dev/vda --meta /meta/ssd.meta --line 64KiB \
		--mode writeback --dirty-high 0.05 --dirty-low 0.02 --export wb --nbd unix:$sock \
		--admin $admin 2>/tmp/tierblk.log &
	pid=$!
	wait_for $sock 60
	nbd-client -unix $sock -N wb /dev/nbd0 || fail "nbd-client connect"
	nbd_sized nbd0
	# Without a volatile write cache the kernel never sends a flush, and fsync proves nothing.
	[ "$(cat /sys/block/nbd0/queue/write_cache)" = "write back" ] ||
		fail "/dev/nbd0 write_cache is '$(cat /sys/block/nbd0/queue/write_cache)', want 'write back' (tierblk must advertise FLUSH)"
}

pattern() { yes "blk=$1 seq=$2" | head -c 4096; }
block() { dd if="$1" bs=4096 skip="$2" count=1 iflag=direct 2>/dev/null; }

case $phase in
write)
	step "mkfs.ext4 /dev/vdc, starting tierblk in write-back mode"
	mkfs.ext4 -q -F /dev/vdc || fail "mkfs.ext4 /dev/vdc"
	start_tierblk
	step "workload running"
	# A fixed LCG: 128 blocks, each in its own cache line, so that blocks are written more than
	# once and the dirty lines (more than --dirty-high) are destaged while the workload runs.
	x=1 seq=0
	while [ $seq -lt 100000 ]; do
		seq=$((seq + 1))
		x=$(((x * 1103515245 + 12345) % 2147483648))
		blk=$((x / 65536 % 128 * 97))
		pattern $blk $seq >/tmp/b
		case $((seq % 6)) in
		0)
			dd if=/tmp/b of=/dev/nbd0 bs=4096 seek=$blk count=1 oflag=direct conv=notrunc,fsync 2>/dev/null ||
				fail "durable write of block $blk"
			echo "TIERBLK-WB: durable $blk $seq"
			;;
		3)
			dd if=/tmp/b of=/dev/nbd0 bs=4096 seek=$blk count=1 oflag=direct conv=notrunc 2>/dev/null ||
				fail "write of block $blk"
			echo "TIERBLK-WB: written $blk $seq"
			dd if=/dev/null of=/dev/nbd0 count=0 conv=notrunc,fsync 2>/dev/null || fail "flush of /dev/nbd0"
			echo "TIERBLK-WB: flushed $seq"
			;;
		*)
			dd if=/tmp/b of=/dev/nbd0 bs=4096 seek=$blk count=1 oflag=direct conv=notrunc 2>/dev/null ||
				fail "write of block $blk"
			echo "TIERBLK-WB: written $blk $seq"
			;;
		esac
	done
	fail "the host did not cut the power"
	;;
check)
	step "starting tierblk again on the same disks"
	start_tierblk
	cat /tmp/tierblk.log
	step "checking $(wc -l </tmp/expect) durable blocks through /dev/nbd0"
	: >/tmp/seen
	verified=0
	while read -r blk min; do
		got=$(block /dev/nbd0 $blk | head -n 1)
		case $got in
		"blk=$blk seq="*) ;;
		*) fail "block $blk holds '$got', want a write of it with seq >= $min" ;;
		esac
		seq=${got#*seq=}
		[ "$seq" -ge "$min" ] || fail "block $blk holds write $seq, older than its durable write $min"
		[ "$(block /dev/nbd0 $blk | md5sum)" = "$(pattern $blk $seq | md5sum)" ] ||
			fail "block $blk is not write $seq whole"
		echo "$blk $seq" >>/tmp/seen
		verified=$((verified + 1))
	done </tmp/expect
	echo "TIERBLK-WB: verified nbd0 $verified"
	tierblk stats --admin $admin
	step "tierblk flush"
	tierblk flush --admin $admin || fail "tierblk flush exited $?"
	nbd-client -d /dev/nbd0 || fail "nbd-client disconnect"
	kill -TERM $pid
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
	step "checking the backend /dev/vdb"
	verified=0
	while read -r blk seq; do
		[ "$(block /dev/vdb $blk | md5sum)" = "$(pattern $blk $seq | md5sum)" ] ||
			fail "the backend's block $blk is not write $seq after tierblk flush"
		verified=$((verified + 1))
	done </tmp/seen
	echo "TIERBLK-WB: verified backend $verified"
	step "all checks passed"
	;;
*) fail "phase is '$phase', want write or check" ;;
esac
