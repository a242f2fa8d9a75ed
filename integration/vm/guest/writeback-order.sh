# Guest test: write-back in FLUSH order (write_back.order: flush) when the SSD tier dies. tierblk
# serves a slow "NAS" (a null_blk device whose requests complete after 50 ms) on /dev/nbd0 in
# write-back, its SSD tier on another null_blk device; ext4 on top, and a writer that fsyncs every
# file and notes when each fsync returned (/proc/uptime). Once the NAS lags (several epochs
# pending, some already written back), the SSD tier's device is powered off for good, mid-write,
# and tierblk is killed. Then the NAS alone, without its cache:
#   - mounts (its journal replayed, as any mount does) and then passes `e2fsck -fn`: a state a
#     crash of the device could have left, never a torn one;
#   - holds, with its checksum, every file whose fsync returned before the oldest epoch the
#     backend lacked when the SSD died began (the cut-off `tierblk stats` gave just before:
#     backend_behind_seconds).
admin=unix:/tmp/admin.sock

# sampled FIELD: a figure of the export's dirty data in the last sample of `tierblk stats --json`,
# /tmp/stats.json (0 if absent: the FLUSH-order figures are left out while nothing is pending).
sampled() {
	tr ',{}' '\n\n\n' </tmp/stats.json | awk -F: -v f="\"$1\"" '$1 ~ f { v = $2 } END { print v + 0 }'
}

insmod /lib/modules/configfs.ko 2>/dev/null
mount -t configfs none /sys/kernel/config 2>/dev/null
insmod /lib/modules/null_blk.ko nr_devices=0 || fail "insmod null_blk"
nullb nas 256 50000000
nas=$dev
nullb ssd 64 0
ssd=$dev
nb=/sys/kernel/config/nullb/ssd

step "tierblk --write-back-order flush over $nas (50 ms a request), SSD tier on $ssd, ext4 on /dev/nbd0, a writer that fsyncs every file"
mkdir -p /tmp/meta
serve_nbd_device /dev/nbd0 /tmp/tierblk.log --backend file://$nas --ssd $ssd --meta /tmp/meta \
	--mode writeback --write-back-order flush --dirty-high 0.1 --dirty-low 0.05 --admin $admin
mkfs.ext4 -q -F -b 4096 /dev/nbd0 || fail "mkfs.ext4"
mount -t ext4 /dev/nbd0 /mnt || fail "mount"
rm -f /tmp/stop
: >/tmp/wlog
(
	n=0
	while [ ! -e /tmp/stop ]; do
		n=$((n + 1))
		dd if=/dev/urandom of=/tmp/src bs=64k count=2 2>/dev/null
		dd if=/tmp/src of=/mnt/f$n bs=64k conv=fsync 2>/dev/null || exit 1
		read -r up _ </proc/uptime
		echo "$(md5sum </tmp/src | cut -d' ' -f1) f$n $up" >>/tmp/wlog
	done
) &
writer=$!

step "waiting until the backend lags: data written back, and epochs pending"
# The SSD tier dies right after the sample that shows the lag, which also gives the cut-off: the
# destager goes on meanwhile, and a sample a few stats calls later (each a second or so under
# emulation) may find the epochs written back.
i=0
while :; do
	kill -0 $writer 2>/dev/null || fail "the writer ended before the SSD tier died"
	i=$((i + 1))
	[ $i -le 600 ] || { tierblk stats --admin $admin; fail "the backend did not lag within 120 s"; }
	read -r now _ </proc/uptime # before the sample: the cut-off below is then never too late
	tierblk stats --admin $admin --json >/tmp/stats.json || fail "tierblk stats"
	[ "$(sampled destaged_bytes)" -ge $((4 << 20)) ] && [ "$(sampled pending_epochs)" -ge 2 ] && break
	sleep 0.2
done

step "the SSD tier's device dies under the writer"
echo 0 >$nb/power || fail "null_blk ssd: power off"
behind=$(sampled backend_behind_seconds)
cutoff=$(awk -v n="$now" -v b="$behind" 'BEGIN { printf "%.2f", n - b }')
echo "at uptime $now: $(sampled pending_epochs) epochs pending, $(sampled destaged_bytes) bytes written back, the backend consistent as of ${behind}s before: cut-off $cutoff"
touch /tmp/stop
wait $writer
rc=$?
echo "writer: $(wc -l </tmp/wlog) files synced, exit $rc (an I/O error once the tier is gone is allowed)"
umount /mnt 2>/dev/null || umount -l /mnt
kill -9 $pid
wait $pid 2>/dev/null
grep -E 'bypassed|order' /tmp/tierblk.log | head -5

step "the NAS alone: $nas mounts, then passes e2fsck -fn"
mount -t ext4 $nas /mnt || fail "mount $nas: the backend is not a file system a crash could leave"
umount /mnt || fail "umount $nas"
e2fsck -fn $nas >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck -fn $nas found errors"; }
tail -n 1 /tmp/fsck.out

step "every file synced before the cut-off reads back from $nas with its checksum"
mount -t ext4 -o ro $nas /mnt || fail "mount $nas read-only"
awk -v c="$cutoff" '$3 < c { print $1 "  " $2 }' /tmp/wlog >/tmp/owed
owed=$(wc -l </tmp/owed)
[ "$owed" -ge 10 ] || fail "only $owed files were synced before the cut-off: the test proves too little"
(cd /mnt && md5sum -c /tmp/owed >/tmp/check.out 2>&1) || { grep -v ': OK' /tmp/check.out; fail "files synced before the cut-off are missing or differ on the backend"; }
later=$(awk -v c="$cutoff" '$3 >= c' /tmp/wlog | wc -l)
kept=0
for f in $(awk -v c="$cutoff" '$3 >= c { print $2 }' /tmp/wlog); do
	[ -e /mnt/$f ] && kept=$((kept + 1))
done
echo "$owed files owed, all intact; of the $later synced after the cut-off, $kept are on the backend"
umount /mnt
step "all checks passed"
