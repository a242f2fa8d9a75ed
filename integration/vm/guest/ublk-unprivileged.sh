# Guest test: an unprivileged user (uid 65532, no capabilities) makes and serves a ublk device, as
# a container that is not privileged would (UBLK_F_UNPRIVILEGED_DEV):
#   1. with /dev/ublk-control open to everyone and a stand-in for udev's rule that gives a new
#      device's nodes to their owner, `tierblk serve --ublk` run by that user makes /dev/ublkb0;
#   2. the owner writes to the device and reads it back, and the data is in the backing file;
#      another user may not open it, whatever the node's mode (the kernel lets only the owner
#      open an unprivileged disk);
#   3. SIGTERM removes it; and without the nodes handed over, tierblk fails with an error that
#      says what is missing (the device it made stays: only root may delete it then).
log=/tmp/tierblk.log
user=tierblk
echo "$user:x:65532:65532::/tmp:/bin/sh" >>/etc/passwd
echo "$user:x:65532:" >>/etc/group
echo "other:x:65533:65533::/tmp:/bin/sh" >>/etc/passwd
as_user() { su -s /bin/sh "$user" -c "export PATH=$PATH; $*"; }
mkdir -p /tmp/u && chown 65532:65532 /tmp/u

step "/dev/ublk-control open to everyone; udev's part: new ublk nodes to their owner"
chmod 0666 /dev/ublk-control /dev/null
(while :; do
	for f in /dev/ublkc* /dev/ublkb*; do [ -e "$f" ] && chown 65532:65532 "$f"; done
	sleep 0.05
done) &
udev=$!

step "tierblk serve --ublk as uid 65532"
as_user "tierblk serve --backend 'file:///tmp/u/disk.img?size=64MiB' --ublk 2>>$log" &
wait_for /dev/ublkb0 60
i=0
until grep -q 'block device' $log; do
	i=$((i + 1)); [ $i -le 300 ] || fail "tierblk did not report its device"
	sleep 0.1
done
pid=$(pidof tierblk) || fail "tierblk is not running"
grep -q "Uid:.*65532" /proc/$pid/status || fail "tierblk does not run as uid 65532: $(grep Uid /proc/$pid/status)"
[ "$(stat -c %u /dev/ublkb0)" = 65532 ] || fail "/dev/ublkb0 is not the user's"

step "the owner writes and reads the device"
head -c 4194304 /dev/urandom >/tmp/u/data
chown 65532 /tmp/u/data
as_user "dd if=/tmp/u/data of=/dev/ublkb0 bs=1M seek=8 conv=fsync 2>/dev/null" || fail "the owner could not write /dev/ublkb0"
echo 3 >/proc/sys/vm/drop_caches
as_user "dd if=/dev/ublkb0 of=/tmp/u/back bs=1M skip=8 count=4 2>/dev/null" || fail "the owner could not read /dev/ublkb0"
cmp /tmp/u/data /tmp/u/back || fail "read back differs from what was written"
dd if=/tmp/u/disk.img of=/tmp/u/file bs=1M skip=8 count=4 2>/dev/null
cmp /tmp/u/data /tmp/u/file || fail "the backing file does not hold what was written"
# Even with the node open to everyone, the kernel lets no other user open the disk.
kill -STOP $udev
chmod 0666 /dev/ublkb0
su -s /bin/sh other -c "dd if=/dev/ublkb0 of=/dev/null bs=4k count=1 2>/dev/null" && fail "another user opened the unprivileged device, which only its owner may"
kill -CONT $udev

step "SIGTERM removes the device"
kill -TERM $pid
i=0
while kill -0 $pid 2>/dev/null; do
	i=$((i + 1)); [ $i -le 300 ] || fail "tierblk did not stop"
	sleep 0.1
done
[ -e /dev/ublkb0 ] && fail "/dev/ublkb0 is still there"
grep -q 'stopped cleanly' $log || fail "tierblk did not stop cleanly"

step "without udev's part the error says what is missing"
kill $udev
as_user "tierblk serve --backend 'file:///tmp/u/disk.img' --ublk 2>/tmp/tierblk-noudev.log" && fail "tierblk served a device whose nodes it cannot open"
grep -q 'udev rule' /tmp/tierblk-noudev.log || fail "the error does not name the missing udev rule: $(cat /tmp/tierblk-noudev.log)"
cat /tmp/tierblk-noudev.log
