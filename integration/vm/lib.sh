# Helpers for guest test scripts, sourced before /test.sh runs.

# step prints progress to the console, so a failure shows how far the test got.
step() { echo "TIERBLK-VM: $*"; }

# fail reports why the test failed, after the logs of the tierblk daemons (/tmp/tierblk*.log);
# /init turns the non-zero exit into the FAIL marker.
fail() {
	for f in /tmp/tierblk*.log; do
		[ -f "$f" ] && { echo "--- $f"; cat "$f"; }
	done
	echo "TIERBLK-VM-FAIL: $*"
	exit 1
}

# wait_for PATH [SECONDS]: wait until PATH exists (a socket or a device node).
wait_for() {
	i=0
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ "$i" -le $((${2:-30} * 10)) ] || fail "timed out waiting for $1"
		sleep 0.1
	done
}

# gone PATH: wait up to 20 seconds for PATH (a device node) to disappear.
gone() {
	i=0
	while [ -e "$1" ]; do
		i=$((i + 1))
		[ "$i" -le 200 ] || fail "$1 still exists"
		sleep 0.1
	done
}

# write_files DIR: a file of 8 MiB and eight small ones of random data in DIR, their checksums in
# /tmp/sums for check_files.
write_files() {
	dd if=/dev/urandom of="$1/big" bs=1M count=8 2>/dev/null || fail "write $1/big"
	for i in 1 2 3 4 5 6 7 8; do
		dd if=/dev/urandom of="$1/small$i" bs=4k count=$i 2>/dev/null || fail "write $1/small$i"
	done
	(cd "$1" && md5sum big small*) >/tmp/sums
}

# check_files DIR WHEN: the files of /tmp/sums read back unchanged from DIR.
check_files() {
	(cd "$1" && md5sum -c /tmp/sums) || fail "checksums differ $2"
}
