# Guest test: restarts of `tierblk serve --ublk --ublk-id 0` (write-back, /dev/vda the backend,
# /dev/vdb the SSD tier) under a mounted ext4 and a writer that fsyncs every file:
#   1. SIGTERM (--ublk-on-stop keep, the default with --ublk-id): tierblk exits 0, /dev/ublkb0
#      stays and /run/tierblk marks it left cleanly; the writer's I/O waits, and so does that of
#      a reader of the raw device, which keeps requests in flight at the stop (they are sent
#      again to the next tierblk). A new tierblk takes the device back (user recovery) and
#      trusts its flushes (every volume was flushed before the mark). Neither saw an error; a file written before the stop reads back from the
#      SSD tier (its hits in `tierblk stats`, next to nothing read from the backend); every file
#      reads back with its checksum after a remount with the page cache dropped.
#   2. SIGTERM, then a tierblk with another backend: it refuses the device, naming both
#      identities, and leaves it as it is; the right one takes it back, the file system intact.
#   3. --ublk-on-stop remove: SIGTERM removes the device, and leaves no mark.
n=0
admin=unix:/tmp/admin.sock

# start_tierblk [ARGS]: start tierblk on device 0 and wait until its device is up.
start_tierblk() {
	n=$((n + 1))
	log=/tmp/tierblk.$n.log
	tierblk serve --backend file:///dev/vda --ssd /dev/vdb --meta /tmp/meta --mode writeback --admin $admin \
		--ublk --ublk-id 0 "$@" 2>$log &
	pid=$!
	wait_log 'msg="block device"'
}

# stop_tierblk: SIGTERM, and tierblk exits 0.
stop_tierblk() {
	kill -TERM $pid
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || fail "tierblk exited $rc after SIGTERM"
}

# left_cleanly: the last tierblk left /dev/ublkb0 with its clean-stop mark.
left_cleanly() {
	grep -q "ublk device left for the next tierblk" $log || fail "tierblk did not leave /dev/ublkb0"
	[ -e /dev/ublkb0 ] || fail "/dev/ublkb0 was removed by SIGTERM"
	[ -s /run/tierblk/left-ublkb0 ] || fail "no clean-stop mark for /dev/ublkb0"
	echo "device left, marked $(cat /run/tierblk/left-ublkb0)"
}

# taken_back: the last tierblk took back the device a clean stop left, trusting its flushes.
taken_back() {
	grep -q "taking back the device a clean stop left" $log || fail "tierblk did not take back the device a clean stop left"
	grep -q "ublk device taken back" $log || fail "tierblk did not recover /dev/ublkb0"
	! grep -q "the first flush fails" $log || fail "the device of a clean stop was distrusted"
	[ ! -e /run/tierblk/left-ublkb0 ] || fail "the mark outlived the take-back"
}

# start_reader reads the first 64 MiB of /dev/ublkb0 past the page cache in a loop ($reader), so
# that requests are in flight when tierblk stops, until /tmp/stop-reader appears.
start_reader() {
	rm -f /tmp/stop-reader
	(
		while [ ! -e /tmp/stop-reader ]; do
			dd if=/dev/ublkb0 of=/dev/null bs=1M count=64 iflag=direct 2>/tmp/reader.err || exit 1
		done
	) &
	reader=$!
}

# stop_reader: the reader saw no error.
stop_reader() {
	touch /tmp/stop-reader
	wait $reader || { cat /tmp/reader.err; fail "a read of /dev/ublkb0 failed across the restart"; }
	echo "reader of /dev/ublkb0: no error"
}

mkdir -p /tmp/meta
step "tierblk --ublk --ublk-id 0 (write-back, SSD tier), ext4, a writer that fsyncs every file"
start_tierblk
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/ublkb0 || fail "mkfs.ext4"
mount -t ext4 /dev/ublkb0 /mnt || fail "mount"
write_warm /mnt
start_writer
start_reader
wait_files 5

step "SIGTERM: tierblk exits 0, /dev/ublkb0 stays; a new tierblk takes it back"
stop_tierblk
left_cleanly
sleep 1
start_tierblk
taken_back
wait_files 5

step "the writer and the reader saw no error; what was written before the stop reads back from the SSD tier; every file reads back after a remount"
stop_reader
stop_writer
ssd_warm $admin /mnt/warm
check_sums /mnt

step "SIGTERM; a tierblk with another backend refuses the device; the right one takes it back"
mount -t ext4 /dev/ublkb0 /mnt || fail "mount again"
stop_tierblk
left_cleanly
timeout 60 tierblk serve --backend mem://256MiB --ublk --ublk-id 0 2>/tmp/tierblk.other.log
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "the tierblk with another backend exited $rc, want an error"
grep 'was left by a tierblk serving another export' /tmp/tierblk.other.log || fail "no clear refusal from the tierblk with another backend"
grep -q "$(cat /run/tierblk/left-ublkb0)" /tmp/tierblk.other.log || fail "the refusal does not name the identity the device was left with"
[ -e /dev/ublkb0 ] || fail "the refused tierblk removed /dev/ublkb0"
start_tierblk
taken_back
(cd /mnt && md5sum -c /tmp/warm.sum) || fail "/mnt/warm differs after the refusal and the take-back"
umount /mnt || fail "umount"

step "--ublk-on-stop remove: SIGTERM removes the device"
stop_tierblk
start_tierblk --ublk-on-stop remove
taken_back
stop_tierblk
gone /dev/ublkb0
[ ! -e /run/tierblk/left-ublkb0 ] || fail "a removed device left a mark"
step "all checks passed"
