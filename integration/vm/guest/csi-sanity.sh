# Guest test: csi-sanity's whole suite (Identity, Controller and Node services) against one
# `tierblk csi --controller --node --attach $attach`, with file system volumes and again with
# raw block volumes (64 MiB dynamic volumes, a 32 MiB SSD tier and 8 MiB of RAM each). The
# volumes were served by the kind of device asked for, and after the suite nothing is left:
# no record, no SSD tier, no device. The plugin exits 0 on SIGTERM.
cat >/tmp/params.yaml <<'PARAMS'
ssdSize: 32MiB
ram: 8MiB
PARAMS
start_csi
for type in mount block; do
	step "csi-sanity, --attach $attach, access type $type"
	csi-sanity --csi.endpoint /tmp/csi.sock --csi.stagingdir /tmp/staging --csi.mountdir /tmp/mount \
		--csi.testvolumesize 67108864 --csi.testvolumeexpandsize 134217728 \
		--csi.testvolumeparameters /tmp/params.yaml --csi.testvolumeaccesstype $type \
		--ginkgo.no-color >/tmp/sanity.out 2>&1
	rc=$?
	grep -E '^(Ran|PASS|FAIL|SUCCESS)|Passed.*Failed' /tmp/sanity.out
	if [ $rc -ne 0 ]; then
		grep -A40 '\[FAIL\]\|\[FAILED\]' /tmp/sanity.out | head -n 400
		fail "csi-sanity ($type, $attach) exited $rc"
	fi
done
grep -qE "msg=\"block device\".* kind=$attach" $log || fail "no volume was served by a $attach device"
echo "devices served: $(grep -cE "msg=\"block device\".* kind=$attach" $log) $attach"
[ -z "$(ls /tmp/state/volumes)" ] || { ls -l /tmp/state/volumes; fail "records left after the suite"; }
[ -z "$(ls /tmp/cache)" ] || { ls -l /tmp/cache; fail "SSD tiers left after the suite"; }
ls /dev/ublkb* 2>/dev/null && fail "ublk devices left after the suite"
for p in /sys/block/nbd*/pid; do [ -e "$p" ] && fail "$p: an NBD device left connected"; done
stop_csi
step "all checks passed"
