# Guest benchmark: tierblk's cache behind its ublk device beside the kernel's own
# caches, over the same two devices, in one guest. Needs the image with the caches (prepare.sh,
# VM_WITH_CACHES=1: fio, dmsetup, make-bcache and the dm-cache, dm-writecache and bcache modules).
#
# The devices are null_blk's, memory-backed and made again for each contender, so that each starts
# empty: a "NAS" of $nas_mib MiB whose requests complete $nas_ms ms after they arrive (null_blk's
# completion timer) and an "SSD" of $ssd_mib MiB that completes them at once. For the rows that
# read, the NAS is first filled with random data (64 MiB of it, over and over), as a NAS holds:
# a cache that keeps no zero blocks (tierblk) would otherwise serve its hits without reading its
# SSD. The contenders, each set up fresh over them with blocks or lines of 64 KiB:
#   none          fio on the NAS itself (no cache);
#   ssd           fio on the SSD itself (the fast device's bound);
#   ublk          tierblk's ublk device over the NAS without a cache (tierblk's own path's bound);
#   dmcache       dm-cache, smq, write-back, its metadata on the first 16 MiB of the SSD;
#   bcache        bcache, write-back, sequential cutoff and congestion bypass off;
#   dmwritecache  dm-writecache (writes only: a log of them on the SSD);
#   tierblk       tierblk serve --ublk --ram 0 --line 64KiB --mode writeback, backend opened direct
#                 (writing back in FLUSH order, the default);
#   tierblkaddr   the same with --write-back-order address.
# The rows, fio in the guest (direct, libaio), each measured over its last $measure s after $warm s:
#   zipf     4 KiB random reads, zipf:1.1 over the NAS, QD16 (IOPS)
#   hits     the same over the first $ssd_mib/2 MiB, which every cache holds after the warm-up:
#            its hits (IOPS)
#   randw    4 KiB random writes over the first $ssd_mib MiB, QD16 (IOPS)
#   seq      1 MiB sequential reads of the whole NAS, QD4 (MB/s; one pass, no warm-up)
#   fsync    ext4 made on the device, 4 writers of 4 KiB random writes (buffered) to files of
#            $ssd_mib/8 MiB each, an fsync every 64 writes (IOPS)
# and for each, the guest's CPU busy over the measured window (from /proc/stat): busy / IOPS is
# the CPU a request costs, kernel and tierblk together.
#
# One line per contender and row on the console, for `tierblk bench kernel` to read:
#   TIERBLK-BENCH: contender=C row=R iops=N mbps=N busy=F lat_p50_us=N lat_p99_us=N
# and with profile=1, for the ublk, tierblk and tierblkaddr contenders' rows but seq, tierblk's
# CPU profile over the measured window (from its admin endpoint on the loopback), base64:
#   TIERBLK-PPROF: contender=C row=R BASE64
# and the contender's own statistics at the row's end (tierblk stats, dm-cache's and
# dm-writecache's status, bcache's sysfs counters), a line each:
#   TIERBLK-STATS: contender=C row=R TEXT
# Variables a line before this script can set:
contenders=${contenders:-"none ssd ublk dmcache bcache dmwritecache tierblk tierblkaddr"}
rows=${rows:-"zipf hits randw seq fsync"}
nas_mib=${nas_mib:-1024}
ssd_mib=${ssd_mib:-256}
nas_ms=${nas_ms:-2}
warm=${warm:-40}
measure=${measure:-20}
profile=${profile:-0}

for m in configfs null_blk libcrc32c dm-mod dm-bufio dm-bio-prison dm-persistent-data dm-cache dm-cache-smq \
	dm-writecache bcache; do
	[ -f /lib/modules/$m.ko ] || fail "module $m not in the image: build it with VM_WITH_CACHES=1"
done
for t in fio dmsetup make-bcache; do
	command -v $t >/dev/null || fail "$t not in the image: build it with VM_WITH_CACHES=1"
done
insmod /lib/modules/configfs.ko 2>/dev/null
mount -t configfs none /sys/kernel/config 2>/dev/null
insmod /lib/modules/null_blk.ko nr_devices=0 || fail "insmod null_blk"
for m in libcrc32c dm-mod dm-bufio dm-bio-prison dm-persistent-data dm-cache dm-cache-smq dm-writecache bcache; do
	insmod /lib/modules/$m.ko || fail "insmod $m"
done
mdev -s
# The loopback: tierblk's admin endpoint, for its statistics and CPU profiles.
ip link set lo up || fail "loopback up"

nullb_gone() {
	d=/sys/kernel/config/nullb/$1
	[ -d "$d" ] || return 0
	echo 0 >"$d/power"
	rmdir "$d" || fail "null_blk $1: remove"
}

sectors() { echo $(($(blockdev --getsize64 "$1") / 512)); }

# fill_nas: random data over the whole NAS, written to it directly (no cache is set up yet).
fill_nas() {
	[ -f /tmp/pattern ] || head -c $((64 << 20)) /dev/urandom >/tmp/pattern || fail "random data"
	i=0
	while [ $i -lt $((nas_mib / 64)) ]; do
		dd if=/tmp/pattern of="$nas" bs=1M seek=$((i * 64)) oflag=direct conv=notrunc 2>/dev/null ||
			fail "filling the NAS"
		i=$((i + 1))
	done
}

# setup_C: the contender's device over $nas and $ssd, in $target; teardown_C undoes it (a
# write-back cache's dirty data is dropped with the devices).
setup_none() { target=$nas; }
teardown_none() { :; }
stats_none() { :; }
setup_ssd() { target=$ssd; }
teardown_ssd() { :; }
stats_ssd() { :; }

tierblk_up() {
	log=/tmp/tierblk.bench.log
	rm -rf /tmp/meta
	tierblk serve --backend "file://$nas?direct=true" --ublk --admin 127.0.0.1:6060 "$@" 2>$log &
	pid=$!
	wait_log 'msg="block device"'
	target=$(grep -o 'msg="block device".*path=[^ ]*' $log | head -n 1 | sed 's/.*path=//')
	wait_for "$target" 30
}
tierblk_down() {
	kill $pid
	wait $pid || fail "tierblk did not stop cleanly: $(tail -n 20 $log)"
	gone "$target"
}
setup_ublk() { tierblk_up; } # no tiers: no cache
teardown_ublk() { tierblk_down; }
stats_ublk() { :; }
setup_tierblk() { tierblk_up --ssd "$ssd" --meta /tmp/meta --ram 0 --line 64KiB --mode writeback "$@"; }
teardown_tierblk() { tierblk_down; }
stats_tierblk() { tierblk stats --admin 127.0.0.1:6060; }
setup_tierblkaddr() { setup_tierblk --write-back-order address; }
teardown_tierblkaddr() { tierblk_down; }
stats_tierblkaddr() { stats_tierblk; }

dm() { dmsetup --noudevsync "$@" || fail "dmsetup $*"; }
setup_dmcache() {
	meta=$((16 * 2048))
	dm create bm-meta --table "0 $meta linear $ssd 0"
	dm create bm-data --table "0 $(($(sectors $ssd) - meta)) linear $ssd $meta"
	dm mknodes
	dd if=/dev/zero of=/dev/mapper/bm-meta bs=1M count=1 2>/dev/null || fail "zero dm-cache's metadata"
	dm create bm-cache --table "0 $(sectors $nas) cache /dev/mapper/bm-meta /dev/mapper/bm-data $nas 128 1 writeback smq 0"
	dm mknodes
	target=/dev/mapper/bm-cache
}
teardown_dmcache() { dm remove bm-cache; dm remove bm-data; dm remove bm-meta; }
# dm-cache's status (Documentation/admin-guide/device-mapper/cache.rst): after the metadata and
# cache block sizes and usages, read hits, read misses, write hits, write misses, demotions,
# promotions, dirty blocks.
stats_dmcache() {
	dmsetup status bm-cache | awk '{ print "read hits " $8 ", read misses " $9 ", write hits " $10 ", write misses " $11 ", demotions " $12 ", promotions " $13 ", dirty blocks " $14 " (of " $7 ")" }'
}
setup_dmwritecache() {
	dm create bm-wc --table "0 $(sectors $nas) writecache s $nas $ssd 4096 0"
	dm mknodes
	target=/dev/mapper/bm-wc
}
teardown_dmwritecache() { dm remove bm-wc; }
# dm-writecache's status (writecache.rst): error, blocks, free blocks, blocks under write-back,
# then reads, read hits, writes, write hits and more.
stats_dmwritecache() { dmsetup status bm-wc | awk '{ print "error " $4 ", free blocks " $6 " of " $5 ", under write-back " $7 ", reads " $8 ", read hits " $9 ", writes " $10 ", write hits " $11 }'; }
setup_bcache() {
	make-bcache --wipe-bcache --block 4k --bucket 64k --writeback -B "$nas" -C "$ssd" >/tmp/make-bcache.log 2>&1 ||
		fail "make-bcache: $(cat /tmp/make-bcache.log)"
	echo "$nas" >/sys/fs/bcache/register 2>/dev/null
	echo "$ssd" >/sys/fs/bcache/register 2>/dev/null
	mdev -s
	wait_for /sys/block/bcache0/bcache 10
	i=0
	until [ "$(cat /sys/block/bcache0/bcache/state)" = clean ] || [ "$(cat /sys/block/bcache0/bcache/state)" = dirty ]; do
		i=$((i + 1))
		[ $i -le 100 ] || fail "bcache0 not attached to its cache: $(cat /sys/block/bcache0/bcache/state)"
		sleep 0.1
	done
	echo writeback >/sys/block/bcache0/bcache/cache_mode
	echo 0 >/sys/block/bcache0/bcache/sequential_cutoff
	for f in /sys/fs/bcache/*/congested_read_threshold_us /sys/fs/bcache/*/congested_write_threshold_us; do
		echo 0 >"$f"
	done
	target=/dev/bcache0
	wait_for $target 10
}
stats_bcache() {
	d=/sys/block/bcache0/bcache
	echo "hits $(cat $d/stats_total/cache_hits), misses $(cat $d/stats_total/cache_misses), bypassed $(cat $d/stats_total/cache_bypass_hits)/$(cat $d/stats_total/cache_bypass_misses), hit ratio $(cat $d/stats_total/cache_hit_ratio) %, dirty $(cat $d/dirty_data), state $(cat $d/state)"
}
teardown_bcache() {
	# Stopped, not detached: a detach would first write the dirty data back to the NAS.
	echo 1 >/sys/block/bcache0/bcache/stop
	for s in /sys/fs/bcache/*-*; do
		[ -e "$s/unregister" ] && echo 1 >"$s/unregister"
	done
	gone /dev/bcache0
	i=0
	while ls -d /sys/fs/bcache/*-* >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -le 200 ] || fail "bcache's cache set still registered"
		sleep 0.1
	done
}

# busy: the guest's busy and total CPU jiffies so far, "busy total".
busy() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }

# run_row ROW: fio's job on $target; prints the result line.
run_row() {
	case $1 in
	zipf) job="--rw=randread --bs=4k --iodepth=16 --random_distribution=zipf:1.1 --time_based --ramp_time=$warm --runtime=$measure" ;;
	hits) job="--rw=randread --bs=4k --iodepth=16 --size=$((ssd_mib / 2))M --random_distribution=zipf:1.1 --time_based --ramp_time=$warm --runtime=$measure" ;;
	randw) job="--rw=randwrite --bs=4k --iodepth=16 --size=${ssd_mib}M --time_based --ramp_time=$warm --runtime=$measure" ;;
	seq) job="--rw=read --bs=1M --iodepth=4" ;;
	fsync) job="--rw=randwrite --bs=4k --size=$((ssd_mib / 8))M --numjobs=4 --fsync=64 --time_based --ramp_time=$warm --runtime=$measure" ;;
	*) fail "unknown row $1" ;;
	esac
	on="--filename=$target --direct=1 --ioengine=libaio"
	if [ "$1" = fsync ]; then
		mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$target" || fail "mkfs.ext4 on $target ($contender)"
		mkdir -p /mnt
		mount -t ext4 "$target" /mnt || fail "mount $target ($contender)"
		on="--directory=/mnt --ioengine=psync --group_reporting"
	fi
	# The window: /proc/stat after the warm-up (a sleep beside fio) and at fio's end.
	b0=$(busy)
	if [ "$1" != seq ]; then
		(sleep "$warm"; busy >/tmp/busy0) &
		clock=$!
	fi
	prof=
	case $profile-$contender-$1 in
	1-ublk-seq | 1-tierblk-seq | 1-tierblkaddr-seq) ;;
	1-ublk-* | 1-tierblk-* | 1-tierblkaddr-*)
		rm -f /tmp/cpu.pprof
		(sleep "$warm"; wget -q -O /tmp/cpu.pprof "http://127.0.0.1:6060/debug/pprof/profile?seconds=$measure") &
		prof=$!
		;;
	esac
	fio --name="$1" $on $job --minimal >/tmp/fio.out 2>/tmp/fio.err ||
		fail "fio $1 on $target ($contender): $(cat /tmp/fio.err)"
	b1=$(busy)
	stats_$contender 2>&1 | sed "s/^/TIERBLK-STATS: contender=$contender row=$1 /"
	if [ "$1" = fsync ]; then
		umount /mnt || fail "umount $target ($contender)"
	fi
	if [ "$1" != seq ]; then
		wait $clock
		b0=$(cat /tmp/busy0)
	fi
	if [ -n "$prof" ]; then
		wait $prof || fail "the CPU profile of $contender, $1: wget failed"
		base64 /tmp/cpu.pprof | sed "s/^/TIERBLK-PPROF: contender=$contender row=$1 /"
	fi
	# --minimal (terse v3, fio 3.33): reads' bandwidth (KiB/s) 7, IOPS 8, completion latency's
	# 50th and 99th percentiles ("50.000000%=N", µs) 24 and 30; writes' the same 41 fields on.
	awk -F';' -v c="$contender" -v r="$1" -v b0="$b0" -v b1="$b1" '{
		w = ($49 > $8); iops = w ? $49 : $8; bw = w ? $48 : $7
		p50 = w ? $65 : $24; p99 = w ? $71 : $30
		sub(/.*=/, "", p50); sub(/.*=/, "", p99)
		split(b0, x, " "); split(b1, y, " ")
		printf "TIERBLK-BENCH: contender=%s row=%s iops=%d mbps=%.1f busy=%.3f lat_p50_us=%d lat_p99_us=%d\n",
			c, r, iops, bw * 1024 / 1e6, (y[1] - x[1]) / (y[2] - x[2]), p50, p99
	}' /tmp/fio.out
}

for contender in $contenders; do
	for row in $rows; do
		step "$contender, $row: devices made again (NAS ${nas_mib} MiB at ${nas_ms} ms, SSD ${ssd_mib} MiB)"
		nullb_gone nas
		nullb_gone ssd
		nullb nas "$nas_mib" $((nas_ms * 1000000))
		nas=$dev
		case $row in randw | fsync) ;; *) fill_nas ;; esac
		nullb ssd "$ssd_mib" 0
		ssd=$dev
		setup_$contender
		run_row "$row"
		teardown_$contender
	done
done
nullb_gone nas
nullb_gone ssd
