# Guest test: write-back with a replica (write_back.replicas), and the primary's host dies. The
# "NAS" is a null_blk device whose requests take 20 ms (so that the write-back lags behind the
# writer), the primary's SSD tier /dev/vda; `tierblk replica serve` keeps the replica log in /tmp
# (the peer host's disk). The primary serves /dev/nbd0 (the kernel's NBD client) in
# write-back with dirty data held long (--dirty-high 0.9), ext4 on top, and a writer that fsyncs
# every file. Then the primary is killed (-9), its SSD tier and metadata wiped (the host is gone),
# and the kernel device detached; twice:
#   1. `tierblk replica drain` writes the log to the NAS, which it changes (the NAS lagged): the
#      NAS alone mounts, holds every file whose fsync returned, with its checksum, and passes
#      `e2fsck -fn`.
#   2. a new primary takes the export over from the replica (--take-over) on a fresh SSD tier and
#      serves /dev/nbd0 again, having applied writes from the log: every fsynced file is there,
#      and the file system passes e2fsck.
admin=unix:/tmp/admin.sock
replog=/tmp/nas.replica
replica=nbd://127.0.0.1:10810/nas
primaries=0

# start_replica serves the replica log on 127.0.0.1:10810 ($peer its PID).
start_replica() {
	tierblk replica serve --log $replog --size 128MiB --export nas --nbd 127.0.0.1:10810 2>/tmp/tierblk-replica.log &
	peer=$!
	wait_log 'msg=serving' /tmp/tierblk-replica.log $peer
}

# start_primary ARGS...: a primary on a blank SSD tier (the host is new), attached as /dev/nbd0.
start_primary() {
	primaries=$((primaries + 1))
	dd if=/dev/zero of=/dev/vda bs=1M count=4 2>/dev/null
	rm -rf /tmp/meta /run/tierblk/runlog-*
	mkdir -p /tmp/meta
	serve_nbd_device /dev/nbd0 /tmp/tierblk.$primaries.log --backend file://$nas --ssd /dev/vda --meta /tmp/meta \
		--mode writeback --dirty-high 0.9 --dirty-max 0.95 --replica $replica --admin $admin "$@"
}

# host_dies: kill -9 the primary under the writer, wipe its SSD tier, detach /dev/nbd0 (failing
# the writer's requests in flight) and unmount; the writer's last file may have failed.
host_dies() {
	tierblk stats --admin $admin | grep -E '^(dirty|write-back order|replica)' # how far the NAS lags
	kill -9 $pid
	wait $pid 2>/dev/null
	dd if=/dev/urandom of=/dev/vda bs=1M count=64 2>/dev/null
	rm -rf /tmp/meta /run/tierblk/runlog-*
	nbd-client -d /dev/nbd0 || fail "nbd-client -d /dev/nbd0"
	touch /tmp/stop
	wait $writer
	echo "writer: $(files_written) files synced before the host died"
	umount -l /mnt 2>/dev/null
	[ "$(files_written)" -gt 0 ] || fail "the writer synced no file"
}

# fsck_clean DEV: e2fsck -fn finds nothing wrong with DEV.
fsck_clean() {
	e2fsck -fn "$1" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck -fn $1"; }
}

ip link set lo up || fail "ip link set lo up"
insmod /lib/modules/configfs.ko 2>/dev/null
mount -t configfs none /sys/kernel/config 2>/dev/null
insmod /lib/modules/null_blk.ko nr_devices=0 || fail "insmod null_blk"
nullb nas 256 20000000
nas=$dev
step "a replica on 127.0.0.1:10810; a primary in write-back with it, /dev/nbd0, ext4, a writer that fsyncs every file"
start_replica
start_primary
mkfs.ext4 -q -F -b 4096 /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
start_writer
wait_files 20

step "the primary's host dies (kill -9, its SSD tier wiped)"
host_dies
tierblk replica status --log $replog || fail "tierblk replica status"
tierblk replica status --log $replog | grep -q ' 0 changes to drain' && fail "the replica log holds no change: the test proves nothing"

step "tierblk replica drain: refused while the replica serves; then the NAS alone holds every fsynced file"
tierblk replica drain --log $replog --backend file://$nas --force 2>/tmp/drain.err && fail "drain ran while the replica served the log"
grep 'stop that first' /tmp/drain.err || { cat /tmp/drain.err; fail "no clear refusal while the replica serves"; }
kill -TERM $peer
wait $peer || fail "tierblk replica serve exited $? after SIGTERM"
before=$(md5sum <$nas)
tierblk replica drain --log $replog --backend file://$nas --force || fail "tierblk replica drain"
[ "$(md5sum <$nas)" != "$before" ] || fail "the drain left the NAS as it was: it lagged by nothing, and the test proves nothing"
mount -t ext4 $nas /mnt || fail "mount the NAS after the drain"
check_sums /mnt
fsck_clean $nas
echo "drain: the NAS holds all $(files_written) fsynced files"

step "a second life: a new primary, the writer, and its host dies too"
start_replica
start_primary
mount -t ext4 /dev/nbd0 /mnt || fail "mount through the new primary"
start_writer
wait_files 20
host_dies

step "a primary on another host takes the export over from the replica (--take-over) and serves /dev/nbd0"
start_primary --take-over
took=$(grep 'took the export over' /tmp/tierblk.$primaries.log) || fail "the new primary did not take the export over"
echo "$took"
case "$took" in *" bytes=0 "*) fail "the take-over applied no write: the test proves nothing" ;; esac
mount -t ext4 /dev/nbd0 /mnt || fail "mount after the take-over"
check_sums /mnt
fsck_clean /dev/nbd0
echo "take-over: all $(files_written) fsynced files are there"
kill -TERM $pid
wait $pid || fail "the primary exited $? after SIGTERM"
kill -TERM $peer
wait $peer || fail "tierblk replica serve exited $? after SIGTERM"
step "all checks passed"
