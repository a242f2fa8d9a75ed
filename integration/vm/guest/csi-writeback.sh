# Guest test: unstaging a write-back block volume writes its dirty data back, or fails. A
# dynamic volume (write-back, a 64 MiB SSD tier) is staged and published as a raw block device;
# 8 MiB of random data go to it through the published device node, synced. An unstage while it
# is published is refused. The backing directory is a tmpfs of 4 MiB: the unstage cannot write
# the data back, and fails, keeping the volume's record and SSD tier. With room made, the
# unstage the CO retries succeeds: the volume's backing file holds every byte, and its device,
# SSD tier and record are gone.
mount -t tmpfs -o size=4m backing /tmp/backing || fail "mount a small tmpfs on /tmp/backing"
start_csi
step "create, stage and publish a write-back block volume (--attach $attach)"
id=$(csiclient create -name pvc-wb -size 67108864 -param mode=writeback -param ssdSize=64MiB -param ram=8MiB -out /tmp/vol.json) ||
	fail "create"
mkdir -p /tmp/staging
csiclient stage -id "$id" -path /tmp/staging -block -context /tmp/vol.json || fail "stage"
csiclient publish -id "$id" -staging /tmp/staging -target /tmp/blk -block || fail "publish"
dev=$(device_of "$id")
attached "$dev"
[ -b /tmp/blk ] || fail "/tmp/blk is not the device"
dd if=/dev/urandom of=/tmp/data bs=1M count=8 2>/dev/null
dd if=/tmp/data of=/tmp/blk bs=1M seek=4 conv=fsync 2>/dev/null || fail "write the device"
want=$(md5sum </tmp/data)
echo "dirty bytes before the unstage: $(dirty_bytes)"

step "an unstage of the published volume is refused: /tmp/blk still binds its device"
csiclient unstage -id "$id" -path /tmp/staging 2>/tmp/unstage.err && fail "the unstage of a published volume succeeded"
cat /tmp/unstage.err
grep -q 'FailedPrecondition.*/tmp/blk: unpublish it first' /tmp/unstage.err || fail "the unstage of a published block volume was not refused as FailedPrecondition"
[ -b "$dev" ] || fail "the refused unstage removed $dev"

step "unpublish"
csiclient unpublish -id "$id" -target /tmp/blk || fail "unpublish"
[ ! -e /tmp/blk ] || fail "the target file is left"
step "unstage with the backing store full: the write-back fails, and so does the unstage"
csiclient unstage -id "$id" -path /tmp/staging 2>/tmp/unstage.err && fail "the unstage succeeded with the backing store full"
cat /tmp/unstage.err
grep -q 'stays staged' /tmp/unstage.err || fail "the unstage's error does not say the volume stays staged"
[ -s /tmp/state/volumes/"$id"/volume.json ] || fail "the failed unstage removed the record"
[ -e /tmp/cache/"$id"/ssd.img ] || fail "the failed unstage removed the SSD tier"

step "room made: the retried unstage writes every byte back"
mount -o remount,size=128m /tmp/backing || fail "grow /tmp/backing"
csiclient unstage -id "$id" -path /tmp/staging || fail "unstage"
released "$dev"
got=$(dd if=/tmp/backing/"$id".img bs=1M skip=4 count=8 2>/dev/null | md5sum)
[ "$got" = "$want" ] || fail "the backing file differs from what was written ($got, want $want)"
[ ! -e /tmp/cache/"$id" ] || fail "the SSD tier of the volume is left"
[ ! -e /tmp/state/volumes/"$id" ] || fail "the record of the volume is left"
csiclient unstage -id "$id" -path /tmp/staging || fail "a second unstage (not staged: OK)"
csiclient delete -id "$id" || fail "delete"
stop_csi
step "all checks passed"
