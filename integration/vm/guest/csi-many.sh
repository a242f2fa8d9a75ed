# Guest test: several volumes on one node plugin, each call arriving at once. Three dynamic
# volumes (two file systems, one raw block device) are staged concurrently: each gets a device of
# its own. After a SIGTERM of the plugin the next one serves all three again, and the admin
# endpoint shows each under its PV's name. Of two stages of one volume at once, one succeeds
# and the other is ABORTED (or, coming after, finds it staged: OK); the three unstage
# concurrently and leave nothing. Last, a volume staged and published read-only reads back and
# refuses writes.
start_csi
step "create three volumes and stage them at once (--attach $attach)"
for i in 1 2 3; do
	csiclient create -name pvc-many-$i -size 67108864 -param ssdSize=16MiB -param ram=4MiB \
		-param csi.storage.k8s.io/pv/name=pv-many-$i -out /tmp/vol$i.json >/dev/null || fail "create $i"
	mkdir -p /tmp/staging$i
done
# stage N ERRFILE: stage volume N, its errors in ERRFILE.
stage() {
	case $1 in 3) block=-block ;; *) block= ;; esac
	csiclient stage -id pvc-many-$1 -path /tmp/staging$1 $block -context /tmp/vol$1.json 2>$2
}
stage 1 /tmp/stage1.err & s1=$!
stage 1 /tmp/stage1b.err & s1b=$!
stage 2 /tmp/stage2.err & s2=$!
stage 3 /tmp/stage3.err & s3=$!
for i in 2 3; do
	eval "wait \$s$i" || { cat /tmp/stage$i.err; fail "stage $i"; }
done
# Volume 1, staged twice at once: one call stages it, the other is ABORTED (or, coming after the
# first was done, finds it staged: OK).
wait $s1
rc1=$?
wait $s1b
rc1b=$?
cat /tmp/stage1.err /tmp/stage1b.err
[ $rc1 -eq 0 ] || [ $rc1b -eq 0 ] || fail "neither stage of volume 1 succeeded"
for e in /tmp/stage1.err /tmp/stage1b.err; do
	[ ! -s $e ] || grep -q Aborted $e || fail "a concurrent stage of volume 1 failed other than ABORTED"
done
devs=""
for i in 1 2 3; do
	d=$(device_of pvc-many-$i)
	attached "$d"
	case " $devs " in *" $d "*) fail "two volumes on $d" ;; esac
	devs="$devs $d"
done
echo "devices:$devs"
grep -q ' /tmp/staging1 ' /proc/mounts && grep -q ' /tmp/staging2 ' /proc/mounts || fail "a file system volume is not mounted"
grep -q ' /tmp/staging3 ' /proc/mounts && fail "the block volume is mounted"
echo data1 >/tmp/staging1/file && echo data2 >/tmp/staging2/file && sync || fail "write the file systems"

step "SIGTERM and a new plugin: all three served again"
stop_csi
start_csi
[ "$(grep -c 'csi: serving a staged volume again' $log)" = 3 ] || fail "the new plugin did not serve the three volumes again"
for i in 1 2; do
	[ "$(cat /tmp/staging$i/file)" = data$i ] || fail "volume $i reads back wrong after the restart"
done
stats=$(tierblk stats --admin $admin --json)
for i in 1 2 3; do
	echo "$stats" | grep -q "\"name\": \"pv-many-$i\"" || fail "the admin endpoint does not show pv-many-$i"
done

step "unstage the three at once"
for i in 1 2 3; do
	csiclient unstage -id pvc-many-$i -path /tmp/staging$i 2>/tmp/unstage$i.err &
	eval "u$i=\$!"
done
for i in 1 2 3; do
	eval "wait \$u$i" || { cat /tmp/unstage$i.err; fail "unstage $i"; }
done
for d in $devs; do released "$d"; done
[ -z "$(ls /tmp/state/volumes)" ] || fail "records left"
[ -z "$(ls /tmp/cache)" ] || fail "SSD tiers left"

step "volume 1 staged and published read-only (SINGLE_NODE_READER_ONLY): its file reads back, a write fails"
csiclient stage -id pvc-many-1 -path /tmp/staging1 -ro -context /tmp/vol1.json || fail "stage read-only"
grep ' /tmp/staging1 ' /proc/mounts | grep -q ' ro,' || { grep ' /tmp/staging1 ' /proc/mounts; fail "/tmp/staging1 is not mounted read-only"; }
csiclient publish -id pvc-many-1 -staging /tmp/staging1 -target /tmp/ro -ro || fail "publish read-only"
[ "$(cat /tmp/ro/file)" = data1 ] || fail "volume 1 reads back wrong read-only"
echo more >/tmp/ro/file 2>/dev/null && fail "a write to the read-only volume succeeded"
csiclient unpublish -id pvc-many-1 -target /tmp/ro || fail "unpublish read-only"
csiclient unstage -id pvc-many-1 -path /tmp/staging1 || fail "unstage read-only"
stop_csi
step "all checks passed"
