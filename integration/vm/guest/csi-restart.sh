# Guest test: restarts of the node plugin under a writer. A dynamic write-back volume (PV name
# pv-restart) is staged and published at /mnt, and a writer fsyncs file after file into it:
#   1. SIGTERM: the plugin exits 0 and leaves the device; a new plugin serves the recorded volume
#      again (its device taken back), its admin endpoint shows the volume under its PV's name.
#   2. kill -9: the device stays; a new plugin serves it again.
# The writer saw no error, and every file it finished reads back with its checksum, with the
# page cache dropped. An unstage while the volume is published is refused. Then unpublish and
# unstage (the dirty data written back, the device, the SSD tier and the record gone), stage
# again from the backing file alone: every file reads back.
# Last, expanded while unstaged, the volume's next stage grows its file system to the new size.
start_csi
step "create, stage and publish a write-back volume (--attach $attach)"
id=$(csiclient create -name pvc-restart -size 134217728 -param mode=writeback -param ssdSize=64MiB -param ram=8MiB \
	-param csi.storage.k8s.io/pv/name=pv-restart -out /tmp/vol.json) || fail "create"
mkdir -p /tmp/staging
csiclient stage -id "$id" -path /tmp/staging -context /tmp/vol.json || fail "stage"
csiclient publish -id "$id" -staging /tmp/staging -target /mnt || fail "publish"
dev=$(device_of "$id")
attached "$dev"
echo "volume $id on $dev"
grep /mnt /proc/mounts
start_writer
wait_files 5

step "SIGTERM: the plugin exits 0, $dev stays; a new plugin serves the volume again"
stop_csi
[ -b "$dev" ] || fail "$dev was removed by the plugin's SIGTERM"
[ -s /tmp/state/volumes/"$id"/volume.json ] || fail "the record is gone"
start_csi
wait_log 'csi: serving a staged volume again'
grep -E 'taken back|took over the device' $log || fail "the new plugin did not take $dev back"
wait_files 5
tierblk stats --admin $admin --json | grep '"name": "pv-restart"' || fail "the admin endpoint does not show the volume by its PV's name"
tierblk stats --admin $admin | head -n 5

step "kill -9: $dev stays; a new plugin serves the volume again"
kill -9 $pid
wait $pid
[ -b "$dev" ] || fail "$dev was removed by the plugin's kill"
start_csi
wait_log 'csi: serving a staged volume again'
grep -E 'taken back|took over the device' $log || fail "the new plugin did not take $dev back after kill -9"
wait_files 5

step "the writer saw no error; every file reads back with the page cache dropped"
stop_writer
sync
echo 3 >/proc/sys/vm/drop_caches
(cd /mnt && md5sum -c /tmp/wsums >/tmp/check.out) || { grep -v ': OK' /tmp/check.out; fail "checksums differ"; }

step "an unstage of the published volume is refused: /mnt still mounts it"
csiclient unstage -id "$id" -path /tmp/staging 2>/tmp/unstage.err && fail "the unstage of a published volume succeeded"
cat /tmp/unstage.err
grep -q 'FailedPrecondition.*unpublish it first' /tmp/unstage.err || fail "the unstage of a published volume was not refused as FailedPrecondition"
grep -q ' /tmp/staging ' /proc/mounts || fail "the refused unstage unmounted /tmp/staging"
[ -b "$dev" ] || fail "the refused unstage removed $dev"

step "unpublish and unstage: written back, device, SSD tier and record gone"
echo "dirty bytes before the unstage: $(dirty_bytes)"
csiclient unpublish -id "$id" -target /mnt || fail "unpublish"
grep -q ' /mnt ' /proc/mounts && fail "/mnt still mounted"
csiclient unstage -id "$id" -path /tmp/staging || fail "unstage"
grep -q ' /tmp/staging ' /proc/mounts && fail "/tmp/staging still mounted"
released "$dev"
[ ! -e /tmp/cache/"$id" ] || fail "the SSD tier of the volume is left"
[ ! -e /tmp/state/volumes/"$id" ] || fail "the record of the volume is left"
tierblk stats --admin $admin --json | grep '"name": "pv-restart"' && fail "the admin endpoint still shows the unstaged volume"

step "stage again, from the backing file alone: every file reads back"
mkdir -p /mnt
csiclient stage -id "$id" -path /tmp/staging -context /tmp/vol.json || fail "stage again"
csiclient publish -id "$id" -staging /tmp/staging -target /mnt || fail "publish again"
(cd /mnt && md5sum -c /tmp/wsums >/tmp/check.out) || { grep -v ': OK' /tmp/check.out; fail "checksums differ after the unstage"; }
before=$(df -k /mnt | awk 'NR == 2 { print $2 }')
csiclient unpublish -id "$id" -target /mnt || fail "unpublish"
csiclient unstage -id "$id" -path /tmp/staging || fail "unstage"

step "expanded offline (unstaged): the next stage grows the file system to the new size"
csiclient expand -id "$id" -size 268435456 || fail "expand"
csiclient stage -id "$id" -path /tmp/staging -context /tmp/vol.json || fail "stage after the expansion"
dev=$(device_of "$id")
[ "$(blockdev --getsize64 "$dev")" = 268435456 ] || fail "$dev is $(blockdev --getsize64 "$dev") bytes after the expansion"
size=$(df -k /tmp/staging | awk 'NR == 2 { print $2 }')
echo "file system: $size KiB, was $before KiB on the 128 MiB volume"
[ "$size" -gt 200000 ] || fail "the file system was not grown to the device ($size KiB)"
(cd /tmp/staging && md5sum -c /tmp/wsums >/tmp/check.out) || { grep -v ': OK' /tmp/check.out; fail "checksums differ after the expansion"; }
csiclient unstage -id "$id" -path /tmp/staging || fail "unstage"
stop_csi
step "all checks passed"
