# Helpers for guest test scripts, sourced before /test.sh runs.

# step prints progress to the console, so a failure shows how far the test got.
step() { echo "TIERBLK-VM: $*"; }

# fail reports why the test failed; /init turns the non-zero exit into the FAIL marker.
fail() {
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
