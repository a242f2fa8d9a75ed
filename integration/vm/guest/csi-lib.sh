# Helpers of the guest tests of `tierblk csi` (csi-*.sh), which the host puts before each script,
# after setting attach (ublk or nbd: the plugin's --attach). /bin/csiclient is the tests' CSI
# client (integration/csiclient), /bin/csi-sanity csi-test's.
csis=0
admin=unix:/tmp/admin.sock
mkdir -p /tmp/backing /tmp/cache /tmp/state

# start_csi: start `tierblk csi --controller --node` ($pid, its log in $log) and wait until it serves.
start_csi() {
	csis=$((csis + 1))
	log=/tmp/tierblk-csi.$csis.log
	tierblk csi --controller --node --node-id vm --endpoint unix:///tmp/csi.sock --backing-dir /tmp/backing \
		--cache-dir /tmp/cache --state-dir /tmp/state --attach "$attach" --admin $admin 2>$log &
	pid=$!
	wait_log 'msg="csi: serving"'
}

# stop_csi: SIGTERM, and the plugin exits 0.
stop_csi() {
	kill -TERM $pid
	wait $pid
	rc=$?
	[ $rc -eq 0 ] || fail "tierblk csi exited $rc after SIGTERM"
}

# device_of ID: the kernel device the plugin recorded for volume ID.
device_of() {
	sed -n 's/.*"device": "\(.*\)".*/\1/p' /tmp/state/volumes/"$1"/volume.json
}

# attached DEV: DEV is a live device of the kind asked for.
attached() {
	case $attach in
	ublk) case $1 in /dev/ublkb*) ;; *) fail "volume on $1, not a ublk device" ;; esac ;;
	nbd) case $1 in /dev/nbd*) ;; *) fail "volume on $1, not an NBD device" ;; esac ;;
	esac
	[ -b "$1" ] || fail "$1 is not a block device"
	[ "$(blockdev --getsize64 "$1")" -gt 0 ] || fail "$1 has no size"
}

# dirty_bytes: the dirty bytes of the SSD tier of the only export of the plugin's admin endpoint.
dirty_bytes() {
	tierblk stats --admin $admin --json | awk '/"dirty": \{/ { d = 1 } d && /"bytes":/ { gsub(/[^0-9]/, ""); print; exit }'
}

# released DEV: the volume's device is no more: a ublk device is removed, an NBD device (whose
# node always exists) disconnected.
released() {
	case $1 in
	/dev/nbd*) [ ! -e /sys/block/${1#/dev/}/pid ] || fail "$1 is still connected" ;;
	*) gone "$1" ;;
	esac
}
