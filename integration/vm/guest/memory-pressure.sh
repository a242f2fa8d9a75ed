# Guest test: a buffered writer on a device tierblk serves, in a guest of 512 MiB
# (run.sh --mem 512), /dev/vda (2G) the backend and /dev/vdb (256M) the SSD tier, the metadata on
# the guest's /tmp (tmpfs, so in its RAM too). For each frontend (ublk: --ublk; nbd: --nbd-device
# /dev/nbd0) and mode in $frontends and $modes, `tierblk serve --ram 32MiB`, ext4 on the device,
# one process writing a file of $size_mib MiB (a 16 MiB chunk of random data, written again and
# again with ordinary buffered writes), sync, and then:
#   - dmesg: no hung task (hung_task_timeout_secs $hung_task_secs, 20; with the hog
#     $hog_hung_task_secs, the kernel's default of 120, see below), no I/O error, no ext4 error, no
#     OOM kill (with the hog: none of tierblk's);
#   - after an unmount, `e2fsck -fn` finds nothing; after drop_caches and a mount again, the file
#     has its size and each of its 16 MiB pieces the checksum of the chunk;
#   - tierblk alive; its oom_score_adj below 0 (not the OOM killer's first choice); every one of
#     its threads with PF_MEMALLOC_NOIO and PF_LOCAL_THROTTLE (the flags PR_SET_IO_FLUSHER sets:
#     never throttled for the dirty pages of the device it serves); the peak of what it holds
#     ("memory": "held_peak_bytes") within the bound `tierblk stats --json` reports ("bound_bytes"),
#     or its peak RSS (VmHWM) within the bound computed here, from a daemon that
#     reports none, the RAM tier + the SSD tier's index + 64 MiB (the bound of the first
#     builds that had one); a SIGTERM stops it cleanly.
# Each case runs twice: alone, and with a memory hog (busybox dd holding a buffer of all but
# $hog_reserve_mib of MemAvailable) started before the writer; the hog may be OOM-killed,
# tierblk must not be. The figures of every run (VmHWM, VmRSS, the daemon's memory object,
# oom_score_adj, the time it took) go to the console. A check that fails is reported and the
# runs go on; the script fails at the end, listing every failed check; a run that cannot go on
# (the writer fails, the file system will not mount, tierblk died) fails at once.
# A run of 128 MiB takes about a minute under qemu's TCG; TestMemoryPressure boots once for each
# frontend and mode, and runs the writer alone and with the hog (a boot may take 5 minutes at
# most). Variables a line before this script (or an edit here) can set, for a longer run by hand
# (the issue's writer wrote three times the guest's RAM: size_mib=1536 write_timeout=900
# hog_hung_task_secs=20, and run.sh --timeout to match):
frontends=${frontends:-"ublk nbd"}      # ublk and/or nbd
modes=${modes:-"writethrough writeback"} # tierblk's --mode
hogs=${hogs:-"no yes"}                   # without and with the memory hog
size_mib=${size_mib:-128}                # the file the writer writes, a multiple of 16
hog_reserve_mib=${hog_reserve_mib:-96}   # MemAvailable the hog leaves
write_timeout=${write_timeout:-100}      # seconds the writer, and then its sync, may take
hung_task_secs=${hung_task_secs:-20}     # the hung-task detector's timeout, without the hog
# With the hog the guest is driven to the OOM killer: until the kernel's reclaim gives up and picks
# a victim, tasks that wait on the device wait with it, since tierblk serving them needs memory
# too (its SSD writes go through the page cache). Under qemu's TCG on a busy 2-core host that lasts
# many times longer than on hardware, so the detector keeps the kernel's default there; the
# full-size runs by hand set 20.
hog_hung_task_secs=${hog_hung_task_secs:-120}

admin=127.0.0.1:9810
ram_tier_mib=32
run=0
: >/tmp/problems

# problem MSG: a check of the current run failed; the runs go on, and the script fails at the end.
problem() {
	echo "TIERBLK-VM: PROBLEM in run $run ($name): $*"
	echo "run $run ($name): $*" >>/tmp/problems
	# What tierblk warned of meanwhile (a connection the kernel closed, a stalled destage).
	[ ! -s "${log:-}" ] || grep -E 'level=(WARN|ERROR)' "$log" | tail -n 30
}

# fatal MSG: the run cannot go on: the kernel's messages, where tierblk's threads wait, the checks
# failed so far, then fail. (A guest whose I/O hangs does not power off after that: /init's sync
# hangs too, and the host's timeout ends it.)
fatal() {
	echo "--- dmesg (last 150 lines)"
	dmesg | tail -n 150
	threads
	[ ! -s /tmp/problems ] || { echo "--- failed checks so far"; cat /tmp/problems; }
	fail "run $run ($name): $*"
}

# threads: where each of tierblk's threads waits (state, wait channel, tid), if it is alive.
threads() {
	[ -n "$pid" ] && kill -0 $pid 2>/dev/null || return 0
	echo "--- tierblk's threads: state and wait channel (tid)"
	for t in /proc/$pid/task/*; do
		echo "$(sed 's/.*) //' $t/stat 2>/dev/null | cut -d' ' -f1) $(cat $t/wchan 2>/dev/null) (${t##*/})"
	done | sort
}

mib() { echo $(($1 / 1048576)); }

# mib1 BYTES: BYTES in MiB with one decimal, so that figures near a bound compare.
mib1() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# now: seconds since the guest booted.
now() { cut -d. -f1 /proc/uptime; }

# kib FIELD FILE: FIELD (VmHWM, MemAvailable, ...) of a /proc status or meminfo file, in KiB; 0 if
# there is none (the process is gone).
kib() {
	v=$(awk -v f="$1:" '$1 == f { print $2; exit }' "$2" 2>/dev/null)
	echo "${v:-0}"
}

# maps PID: where the RSS of PID lies, from its smaps: the resident MiB of each mapping's file
# (or [anon] for anonymous memory), the largest first, those of 1 MiB or more.
maps() {
	awk '
		$1 ~ /^[0-9a-f]+-[0-9a-f]+$/ { name = $6 == "" ? "[anon]" : $6 ($7 == "" ? "" : " " $7); next }
		$1 == "Rss:" { kb[name] += $2 }
		END { for (n in kb) if (kb[n] >= 1024) printf "%d %s\n", kb[n] / 1024, n }' /proc/$1/smaps 2>/dev/null |
		sort -rn | awk '{ printf "%s%s %s MiB", (NR > 1 ? ", " : ""), $2, $1 }'
}

# monitor: every 15 s while the writer runs, a line of figures: the file's size, the guest's
# MemAvailable, Dirty and Writeback, tierblk's RSS and the hog's; and where tierblk's RSS lies.
start_monitor() {
	rm -f /tmp/stop-monitor /tmp/hung-shown
	(
		t=0
		while [ ! -e /tmp/stop-monitor ]; do
			sleep 15
			t=$((t + 15))
			size=$(stat -c %s /mnt/big 2>/dev/null || echo 0)
			echo "  ${t}s: file $(mib $size) MiB; MemAvailable $(($(kib MemAvailable /proc/meminfo) / 1024)) MiB," \
				"Dirty $(($(kib Dirty /proc/meminfo) / 1024)) MiB, Writeback $(($(kib Writeback /proc/meminfo) / 1024)) MiB;" \
				"tierblk VmRSS $(($(kib VmRSS /proc/$pid/status) / 1024)) MiB${hog:+, hog VmRSS $(($(kib VmRSS /proc/$hog/status) / 1024)) MiB}"
			echo "    tierblk: RssAnon $(($(kib RssAnon /proc/$pid/status) / 1024)) MiB, RssShmem $(($(kib RssShmem /proc/$pid/status) / 1024)) MiB; by mapping: $(maps $pid)"
			# Write-back: how full, how fast it drains, how long a write is held (a stall shows
			# here). busybox wget, not tierblk stats: a client named tierblk that the OOM killer
			# took would read as the daemon killed.
			echo "    dirty: $(timeout 10 wget -q -O - "http://$admin/stats" 2>/dev/null |
				grep -oE '"(ratio|destaging|destage_bytes_per_second|throttled_writes|throttle_delay_seconds|backend_waits)":[^,}]*' |
				tr '\n' ' ')"
			echo "    tierblk: $(grep -c 'level=WARN' "$log" 2>/dev/null) warnings so far"
			# The first hung-task warning of the run: where tierblk's threads wait then (the
			# kernel's own report has only the blocked task's stack), while it is still stalled.
			if [ ! -e /tmp/hung-shown ] && dmesg | grep -q 'blocked for more than'; then
				touch /tmp/hung-shown
				threads
			fi
		done
	) &
	monitor=$!
}

stop_monitor() {
	touch /tmp/stop-monitor
	wait $monitor
}

# memory_object FILE prints the top-level "memory" object of FILE, the output of `tierblk stats
# --json` (nothing if it has none).
memory_object() {
	awk '
		/^  "memory": \{\}/ { print; exit }
		/^  "memory": \{/ { p = 1 }
		p { print }
		p && /^  \},?$/ { exit }' "$1"
}

# thread_flags: every thread of tierblk ($pid) has PF_MEMALLOC_NOIO (0x80000) and PF_LOCAL_THROTTLE
# (0x100000), which PR_SET_IO_FLUSHER sets; field 9 of /proc/PID/task/TID/stat.
thread_flags() {
	threads=0 lacking=0 shown=""
	for s in /proc/$pid/task/*/stat; do
		f=$(sed 's/.*) //' "$s" 2>/dev/null | awk '{ print $7 }')
		[ -n "$f" ] || continue
		threads=$((threads + 1))
		if [ $((f & 0x80000)) = 0 ] || [ $((f & 0x100000)) = 0 ]; then
			lacking=$((lacking + 1))
			tid=${s#/proc/$pid/task/}
			[ $lacking -gt 4 ] || shown="$shown ${tid%/stat}:0x$(printf %x "$f")"
		fi
	done
	echo "tierblk threads: $threads, lacking PF_MEMALLOC_NOIO or PF_LOCAL_THROTTLE: $lacking${shown:+ (tid:flags$shown ...)}"
	[ $lacking = 0 ] || problem "$lacking of $threads tierblk threads lack PF_MEMALLOC_NOIO|PF_LOCAL_THROTTLE (0x180000): tierblk does not run with PR_SET_IO_FLUSHER"
}

# check_dmesg: what the kernel logged during the run: hung tasks, I/O errors, ext4 errors, OOM kills.
check_dmesg() {
	dmesg -c >/tmp/dmesg.$run
	n=$(grep -c 'blocked for more than' /tmp/dmesg.$run)
	[ "$n" = 0 ] || {
		grep -E 'blocked for more than' /tmp/dmesg.$run | head -n 10
		problem "$n hung-task warnings (blocked for more than $(cat /proc/sys/kernel/hung_task_timeout_secs) s)"
	}
	grep -E 'I/O error|EXT4-fs error|EXT4-fs warning|potential data loss|nbd.*(timed out|Dead connection)' /tmp/dmesg.$run >/tmp/errors.$run
	[ ! -s /tmp/errors.$run ] || {
		head -n 10 /tmp/errors.$run
		problem "$(wc -l </tmp/errors.$run) I/O or ext4 errors in dmesg"
	}
	grep -E 'Out of memory|oom-kill|Killed process' /tmp/dmesg.$run >/tmp/oom.$run
	[ ! -s /tmp/oom.$run ] || cat /tmp/oom.$run
	if grep -qE '\(tierblk\)|task=tierblk' /tmp/oom.$run; then
		problem "tierblk was OOM-killed"
	elif [ $with_hog = no ] && [ -s /tmp/oom.$run ]; then
		problem "an OOM kill without the memory hog"
	fi
}

# start_tierblk: tierblk serving the first export through $frontend, the device in $dev.
start_tierblk() {
	log=/tmp/tierblk.$run.log
	rm -rf /tmp/meta.*
	case $frontend in
	ublk) args=--ublk ;;
	nbd) args="--nbd-device /dev/nbd0 --nbd-device-on-stop release" ;;
	*) fail "unknown frontend $frontend" ;;
	esac
	tierblk serve --backend file:///dev/vda --ram ${ram_tier_mib}MiB --ssd /dev/vdb --meta /tmp/meta.$run \
		--mode $mode --admin $admin $args 2>$log &
	pid=$!
	wait_log 'msg="block device"'
	dev=$(grep -o 'msg="block device".*path=[^ ]*' $log | head -n 1 | sed 's/.*path=//')
	wait_for "$dev" 30
	case $frontend in nbd) nbd_sized nbd0 ;; esac
}

# check_file: /mnt/big has $size_mib MiB, and each of its 16 MiB pieces the checksum of /tmp/chunk.
check_file() {
	got=$(stat -c %s /mnt/big)
	[ "$got" = $((size_mib * 1048576)) ] || problem "the file has $got bytes, want $((size_mib * 1048576))"
	i=0 bad=0
	while [ $i -lt $chunks ]; do
		sum=$(dd if=/mnt/big bs=1M skip=$((i * 16)) count=16 2>/dev/null | md5sum | cut -d' ' -f1)
		[ "$sum" = "$want" ] || {
			bad=$((bad + 1))
			[ $bad -gt 3 ] || echo "the file's MiB $((i * 16)) to $((i * 16 + 16)) read back $sum, want $want"
		}
		i=$((i + 1))
	done
	[ $bad = 0 ] || problem "$bad of the file's $chunks pieces of 16 MiB read back wrong after a remount with the page cache dropped"
	echo "checksums: $((chunks - bad)) of $chunks pieces of 16 MiB right after the remount"
}

# stop_tierblk: SIGTERM, and tierblk exits 0 within 120 s (write-back: once all is destaged),
# leaving no device behind.
stop_tierblk() {
	kill -TERM $pid
	i=0
	while kill -0 $pid 2>/dev/null; do
		i=$((i + 1))
		[ $i -le 1200 ] || fatal "tierblk did not exit within 120 s of SIGTERM"
		sleep 0.1
	done
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || { tail -n 20 $log; problem "tierblk exited $rc after SIGTERM"; }
	case $frontend in
	ublk) gone "$dev" ;;
	nbd) [ "$(cat /sys/block/nbd0/size)" = 0 ] || problem "/dev/nbd0 still attached after the stop" ;;
	esac
}

# start_hog: a process holding (and touching, again and again) a buffer of all but
# $hog_reserve_mib of MemAvailable, niced so that it takes little of the CPU; waits until it holds
# 90 % of it.
start_hog() {
	avail=$(($(kib MemAvailable /proc/meminfo) / 1024))
	hog_mib=$((avail - hog_reserve_mib))
	[ $hog_mib -ge 32 ] || fatal "MemAvailable $avail MiB leaves no room for a hog that leaves $hog_reserve_mib MiB"
	dd if=/dev/zero of=/dev/null bs=${hog_mib}M count=1000000 2>/tmp/hog.err &
	hog=$!
	renice 19 -p $hog >/dev/null
	i=0
	until [ "$(kib VmRSS /proc/$hog/status)" -ge $((hog_mib * 1024 * 9 / 10)) ] 2>/dev/null; do
		kill -0 $hog 2>/dev/null || { cat /tmp/hog.err; echo "the hog died before it held its buffer"; break; }
		i=$((i + 1))
		[ $i -le 600 ] || fatal "the hog did not take $hog_mib MiB within 60 s"
		sleep 0.1
	done
	echo "memory hog: $hog_mib MiB of the $avail MiB available (leaving $hog_reserve_mib), VmRSS $(($(kib VmRSS /proc/$hog/status) / 1024)) MiB"
}

stop_hog() {
	if kill -0 $hog 2>/dev/null; then
		hog_end="alive at the end (VmRSS $(($(kib VmRSS /proc/$hog/status) / 1024)) MiB)"
		kill -9 $hog
	else
		hog_end="gone before the end of the writer"
	fi
	echo "memory hog: $hog_end"
	wait $hog 2>/dev/null
	hog=""
}

# case_run: one run of the writer on $frontend in $mode, with the hog if $with_hog is yes.
case_run() {
	run=$((run + 1))
	name="$frontend $mode$([ $with_hog = no ] || echo ', memory hog')"
	step "run $run: $name: tierblk serve --ram ${ram_tier_mib}MiB --ssd /dev/vdb, ext4, a buffered writer of $size_mib MiB"
	t0=$(now)
	dmesg -c >/dev/null
	if [ $with_hog = no ]; then
		echo $hung_task_secs >/proc/sys/kernel/hung_task_timeout_secs
	else
		echo $hog_hung_task_secs >/proc/sys/kernel/hung_task_timeout_secs
	fi
	start_tierblk
	echo "tierblk serves $dev (pid $pid): VmRSS $(($(kib VmRSS /proc/$pid/status) / 1024)) MiB idle, oom_score_adj $(cat /proc/$pid/oom_score_adj);" \
		"$dev: read_ahead_kb $(cat /sys/block/${dev#/dev/}/queue/read_ahead_kb), max_sectors_kb $(cat /sys/block/${dev#/dev/}/queue/max_sectors_kb)"
	mkfs.ext4 -q -F -E nodiscard "$dev" >/tmp/mkfs.out 2>&1 || { cat /tmp/mkfs.out; fatal "mkfs.ext4 $dev"; }
	tm=$(now)
	mount -t ext4 "$dev" /mnt || fatal "mount $dev"
	hog="" hog_mib=""
	[ $with_hog = no ] || start_hog

	start_monitor
	t1=$(now)
	timeout $write_timeout sh -c 'i=0; while [ $i -lt $1 ]; do cat /tmp/chunk || exit 1; i=$((i + 1)); done >/mnt/big' \
		sh $chunks 2>/tmp/writer.err
	rc=$?
	t2=$(now)
	[ $rc -eq 0 ] && [ ! -s /tmp/writer.err ] || {
		stop_monitor
		cat /tmp/writer.err
		fatal "the writer failed (exit $rc$([ $rc != 143 ] || echo ": killed after $write_timeout s"))"
	}
	timeout $write_timeout sync || { stop_monitor; fatal "sync failed or took more than $write_timeout s (exit $?)"; }
	t3=$(now)
	stop_monitor
	echo "writer: $size_mib MiB in $((t2 - t1)) s, sync $((t3 - t2)) s"
	[ -z "$hog" ] || stop_hog

	kill -0 $pid 2>/dev/null || fatal "tierblk died during the writer"
	echo "tierblk: VmHWM $(($(kib VmHWM /proc/$pid/status) / 1024)) MiB, VmRSS $(($(kib VmRSS /proc/$pid/status) / 1024)) MiB, oom_score_adj $(cat /proc/$pid/oom_score_adj); meta $(du -sm /tmp/meta.$run | cut -f1) MiB"
	hwm=$(($(kib VmHWM /proc/$pid/status) * 1024))
	tierblk stats --admin $admin --json >/tmp/stats.$run || problem "tierblk stats --json failed"
	memory_object /tmp/stats.$run >/tmp/memory.$run
	if [ -s /tmp/memory.$run ]; then
		cat /tmp/memory.$run
		bound=$(awk '/^    "bound_bytes":/ { gsub(/[^0-9]/, "", $2); print $2; exit }' /tmp/memory.$run)
		[ -n "$bound" ] || problem "the memory object of tierblk stats has no bound_bytes"
		# The bound is on what the daemon holds (anonymous and shared memory), which it samples
		# for its peak; VmHWM counts its binary's pages too, which the kernel reclaims.
		held=$(awk '/^    "held_peak_bytes":/ { gsub(/[^0-9]/, "", $2); print $2; exit }' /tmp/memory.$run)
		[ -n "$held" ] || problem "the memory object of tierblk stats has no held_peak_bytes"
		echo "tierblk: held peak $(mib1 ${held:-0}) MiB"
		hwm=${held:-$hwm}
	else
		lines=$(awk '$1 == "\"name\":" && $2 ~ /^"ssd"/ { ssd = 1 } ssd && $1 == "\"capacity\":" { sub(/,$/, "", $2); print $2; exit }' /tmp/stats.$run)
		# reduction compress: the SSD tier indexes packed slots, 324 bytes each at most
		# (internal/cache: packedIndexBytesPerLine(16)).
		bound=$(((ram_tier_mib + 64) * 1048576 + ${lines:-0} * 324))
		echo "memory: tierblk stats --json has no \"memory\" object yet; the bound computed here:" \
			"${ram_tier_mib} MiB RAM tier + 64 MiB + ${lines:-?} SSD index slots x 324 B = $(mib1 $bound) MiB"
	fi
	[ -z "$bound" ] || [ $hwm -le $bound ] ||
		problem "tierblk's peak (held_peak_bytes, or VmHWM from a daemon without them) $(mib1 $hwm) MiB is over its bound $(mib1 $bound) MiB"
	thread_flags
	[ "$(cat /proc/$pid/oom_score_adj)" -lt 0 ] ||
		problem "tierblk's oom_score_adj is $(cat /proc/$pid/oom_score_adj) while it serves $dev: it is not lowered"

	t4=$(now)
	umount /mnt || fatal "umount"
	e2fsck -fn "$dev" >/tmp/fsck.$run 2>&1
	rc=$?
	[ $rc -eq 0 ] || { cat /tmp/fsck.$run; problem "e2fsck -fn $dev found problems (exit $rc)"; }
	echo 3 >/proc/sys/vm/drop_caches
	mount -t ext4 "$dev" /mnt || fatal "mount $dev again"
	t5=$(now)
	check_file
	umount /mnt || fatal "umount after the check"
	t6=$(now)

	stop_tierblk
	check_dmesg
	t7=$(now)
	echo "run $run ($name): peak $(mib1 $hwm) MiB (bound $(mib1 $bound)); $((t7 - t0)) s in all: start and mkfs $((tm - t0)) s," \
		"writer $((t2 - t1)) s, sync $((t3 - t2)) s, figures $((t4 - t3)) s, e2fsck and mount $((t5 - t4)) s," \
		"checksums $((t6 - t5)) s, stop $((t7 - t6)) s${hog_mib:+; the hog ($hog_mib MiB) $hog_end}" | tee -a /tmp/summary
}

ip link set lo up || fail "ip link set lo up"
[ -e /proc/sys/kernel/hung_task_timeout_secs ] || fail "the kernel has no hung-task detector"
echo -1 >/proc/sys/kernel/hung_task_warnings
[ $((size_mib % 16)) = 0 ] || fail "size_mib $size_mib is not a multiple of 16"
chunks=$((size_mib / 16))
step "guest: $(($(kib MemTotal /proc/meminfo) / 1024)) MiB, $(($(kib MemAvailable /proc/meminfo) / 1024)) MiB available; the writer's data: 16 MiB of random data x $chunks"
dd if=/dev/urandom of=/tmp/chunk bs=1M count=16 2>/dev/null || fail "dd /tmp/chunk"
want=$(md5sum </tmp/chunk | cut -d' ' -f1)
: >/tmp/summary
for frontend in $frontends; do
	for mode in $modes; do
		for with_hog in $hogs; do
			case_run
		done
	done
done
step "summary"
cat /tmp/summary
[ ! -s /tmp/problems ] || { cat /tmp/problems; fail "$(wc -l </tmp/problems) checks failed"; }
step "all checks passed"
