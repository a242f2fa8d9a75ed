# tierblk: `make run` serves the default disk, `make test` runs every test, `make bench` measures.
# Each target installs what it needs (Debian packages via apt-get when root, Go modules).

SHELL := /bin/bash
GO ?= go
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN := bin/tierblk
DATA := $(CURDIR)/data
SOCK := $(DATA)/tierblk.sock
PORT ?= 10809
SIZE ?= 1GiB
RAM ?= 64MiB
SSD_SIZE ?= 256MiB
# Debian packages the tests and benchmarks use: real NBD peers, a kernel under qemu, losetup (mount),
# certtool (gnutls-bin) for the TLS tests' certificates, tgtd (tgt) as an iSCSI target, and qemu's
# iSCSI driver (qemu-block-extra: qemu-utils only recommends it) for bench nbd's iscsi part.
# prometheus (with promtool) for the dashboard test; systemd: systemd-socket-activate and
# systemd-analyze for the service tests; podman and runc (IMAGE_DEB_PACKAGES) for the image and its
# test, podman-compose for the test of configs/compose.yaml; e2fsprogs (mkfs.ext4 in the VM too) and
# xfsprogs (CSI_DEB_PACKAGES) for the CSI driver's image; dmsetup and make-bcache (bcache-tools) for
# the kernel VM's image of bench kernel (KERNEL_BENCH_DEB_PACKAGES).
IMAGE_DEB_PACKAGES := podman runc
CSI_DEB_PACKAGES := e2fsprogs xfsprogs
KERNEL_BENCH_DEB_PACKAGES := dmsetup bcache-tools
DEB_PACKAGES := fio libnbd-bin nbdkit qemu-utils nbd-client qemu-system-x86 busybox-static cpio \
	xz-utils kmod mount gnutls-bin tgt qemu-block-extra prometheus systemd $(IMAGE_DEB_PACKAGES) \
	$(CSI_DEB_PACKAGES) podman-compose $(KERNEL_BENCH_DEB_PACKAGES)
TEST_TIMEOUT ?= 60m
TESTLOG ?= $(CURDIR)/.cache/test.log

.PHONY: all build install image image-csi run test unit integration crash-campaign standalone fuzz-short bench deps deps-deb deps-go fmt-check clean

all: build

build: deps-go
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/tierblk

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary to $(PREFIX)/bin, the systemd units to
# $(PREFIX)/lib/systemd/system (systemd's search path for locally installed units; /etc/systemd/system
# stays the administrator's) with ExecStart= pointing at that binary, and the example config to
# /etc/tierblk/example.yaml, never over an existing file (it may have been edited).
PREFIX ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/tierblk
	install -d $(DESTDIR)$(UNITDIR)
	for u in configs/tierblk@.service configs/tierblk@.socket; do \
	  sed -e 's#/usr/local/bin/tierblk#$(PREFIX)/bin/tierblk#g' -e 's#/etc/tierblk/#$(SYSCONFDIR)/tierblk/#g' "$$u" > $(DESTDIR)$(UNITDIR)/$$(basename "$$u") && \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename "$$u") || exit 1; \
	done
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/tierblk
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/tierblk/example.yaml ]; then \
	  echo "install: keeping the existing $(DESTDIR)$(SYSCONFDIR)/tierblk/example.yaml"; \
	else install -m 0644 configs/tierblk.example.yaml $(DESTDIR)$(SYSCONFDIR)/tierblk/example.yaml; fi
	@echo "installed; next: copy $(SYSCONFDIR)/tierblk/example.yaml to $(SYSCONFDIR)/tierblk/NAME.yaml, edit it, then"
	@echo "  systemctl daemon-reload && systemctl enable --now tierblk@NAME.service"

# make image [IMAGE=localhost/tierblk]: the OCI image of Containerfile, tagged $(VERSION) and latest:
# the static binary on an empty base (nothing is pulled, so it builds offline), the default config
# configs/container.yaml as /etc/tierblk/tierblk.yaml, and the state and socket directories owned by
# the image's user. Only podman and runc are installed for it, not every test's packages.
IMAGE ?= localhost/tierblk
IMAGE_CONTEXT ?= $(CURDIR)/.cache/image
image: build
	@$(MAKE) -s deps-deb DEB_PACKAGES="$(IMAGE_DEB_PACKAGES)"
	rm -rf $(IMAGE_CONTEXT)
	install -D -m 0755 $(BIN) $(IMAGE_CONTEXT)/rootfs/usr/local/bin/tierblk
	install -D -m 0644 configs/container.yaml $(IMAGE_CONTEXT)/rootfs/etc/tierblk/tierblk.yaml
	install -d -m 0755 $(IMAGE_CONTEXT)/state
	podman build --pull=never -f Containerfile -t $(IMAGE):$(VERSION) -t $(IMAGE):latest \
	  --label org.opencontainers.image.title=tierblk --label org.opencontainers.image.version=$(VERSION) \
	  --label org.opencontainers.image.revision=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --label org.opencontainers.image.licenses=Apache-2.0 $(IMAGE_CONTEXT)
	@echo "image $(IMAGE):$(VERSION); run it as docs/operations.md#containers says, e.g."
	@echo "  podman run -d --name tierblk -v tierblk-state:/var/lib/tierblk -v tierblk-run:/run/tierblk $(IMAGE):$(VERSION)"

# make image-csi [CSI_IMAGE=localhost/tierblk-csi]: the CSI driver's image (Containerfile.csi,
# configs/kubernetes/), tagged $(VERSION) and latest: the static binary and the file system tools
# of CSI_TOOLS, each with the shared libraries ldd lists at the path ldd gives (so the dynamic
# loader finds them there), and the Debian copyright files of the packages they come from. It
# pulls nothing; push it where the cluster's nodes pull from (docs/operations.md#kubernetes).
CSI_IMAGE ?= localhost/tierblk-csi
CSI_IMAGE_CONTEXT ?= $(CURDIR)/.cache/image-csi
CSI_TOOLS := /usr/sbin/mke2fs /usr/sbin/resize2fs /usr/sbin/mkfs.xfs /usr/sbin/xfs_growfs
image-csi: build
	@$(MAKE) -s deps-deb DEB_PACKAGES="$(IMAGE_DEB_PACKAGES) $(CSI_DEB_PACKAGES)"
	rm -rf $(CSI_IMAGE_CONTEXT)
	install -D -m 0755 $(BIN) $(CSI_IMAGE_CONTEXT)/rootfs/usr/local/bin/tierblk
	@set -e; root=$(CSI_IMAGE_CONTEXT)/rootfs; \
	for t in $(CSI_TOOLS); do \
	  files="$$t $$(ldd $$t | grep -o '/[^ ]*')"; \
	  for f in $$files; do \
	    install -D -m 0755 "$$f" "$$root$$f"; \
	    p=$$(dpkg -S "$$f" 2>/dev/null || dpkg -S "$${f#/usr}" 2>/dev/null || dpkg -S "/usr$$f" 2>/dev/null) || \
	      { echo "image-csi: no Debian package owns $$f (its copyright must go in the image)"; exit 1; }; \
	    p=$${p%%:*}; install -D -m 0644 /usr/share/doc/$$p/copyright "$$root/usr/share/doc/$$p/copyright"; \
	  done; \
	done; \
	for fs in ext4 ext3 ext2; do ln -s mke2fs "$$root/usr/sbin/mkfs.$$fs"; done; \
	install -D -m 0644 /etc/mke2fs.conf "$$root/etc/mke2fs.conf"
	podman build --pull=never -f Containerfile.csi -t $(CSI_IMAGE):$(VERSION) -t $(CSI_IMAGE):latest \
	  --label org.opencontainers.image.title=tierblk-csi --label org.opencontainers.image.version=$(VERSION) \
	  --label org.opencontainers.image.revision=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --label org.opencontainers.image.licenses="Apache-2.0 AND GPL-2.0-only AND LGPL-2.1-or-later" $(CSI_IMAGE_CONTEXT)
	@echo "image $(CSI_IMAGE):$(VERSION); push it and name it in configs/kubernetes/kustomization.yaml, e.g."
	@echo "  podman push $(CSI_IMAGE):$(VERSION) registry.example.com/tierblk/tierblk-csi:$(VERSION)"

# The embedded default: a sparse file of $(SIZE) under ./data, served over a unix socket and TCP.
run: build
	@mkdir -p $(DATA)
	@echo "tierblk: serving $(DATA)/disk.img ($(SIZE), sparse) through a cache: $(RAM) of RAM, then $(SSD_SIZE) on $(DATA)/ssd.img"
	@echo "  on unix:$(SOCK) and 127.0.0.1:$(PORT); the cache stays warm across restarts"
	@echo "  inspect:  nbdinfo 'nbd+unix:///?socket=$(SOCK)'"
	@echo "  qemu:     qemu-io -f raw 'nbd+unix:///?socket=$(SOCK)' -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k'"
	@echo "  fio:      fio --name=t --ioengine=nbd --uri='nbd+unix:///?socket=$(SOCK)' --rw=randread --bs=4k --iodepth=32 --size=256m --runtime=10 --time_based"
	@echo "  kernel:   modprobe nbd && nbd-client -unix $(SOCK) /dev/nbd0   (or: nbd-client 127.0.0.1 $(PORT) /dev/nbd0)"
	@echo "  devices:  tierblk itself gives /dev/ublkbN with serve --ublk, or /dev/nbdN with --nbd-device /dev/nbdN (as root)"
	@echo "  stats:    $(BIN) stats --admin unix:$(DATA)/admin.sock"
	@echo "  stop:     Ctrl-C (finishes in-flight requests, flushes, keeps the cache's index)"
	exec $(BIN) serve --backend 'file://$(DATA)/disk.img?size=$(SIZE)' --nbd unix:$(SOCK) --nbd 127.0.0.1:$(PORT) \
	  --ram $(RAM) --ssd $(DATA)/ssd.img --ssd-size $(SSD_SIZE) --admin unix:$(DATA)/admin.sock

# -count=1: the integration tests build the binary themselves, which go test's cache cannot see.
test: deps fmt-check standalone fuzz-short
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@# tierblk sim and the admin clients build on macOS too (serve and bench are Linux only).
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/tierblk
	@mkdir -p $(dir $(TESTLOG))
	@set -o pipefail; $(GO) test -race -count=1 -v -timeout $(TEST_TIMEOUT) ./... > $(TESTLOG) 2>&1; status=$$?; \
	  grep -E '^(ok|FAIL|panic:)|--- SKIP' $(TESTLOG); \
	  if [ $$status != 0 ]; then echo "--- failures (whole log: $(TESTLOG)):"; grep -A 25 -E -- '^panic:' $(TESTLOG) | head -n 100; \
	    grep -E 'TIERBLK-VM(: PROBLEM|-FAIL|-LOG|-RESULT: FAIL)' $(TESTLOG) | head -n 40; \
	    awk -f scripts/test-failures.awk $(TESTLOG) | head -n 150; fi; \
	  echo "tests: $$(grep -Ec -- '--- PASS' $(TESTLOG)) passed, $$(grep -Ec -- '--- FAIL' $(TESTLOG)) failed, $$(grep -Ec -- '--- SKIP' $(TESTLOG)) skipped"; \
	  exit $$status

# The packages whose tests read testdata/ (traces, corpora), run in a copy of the working tree
# (what git would commit: tracked and unignored files) under a fresh temporary directory, so that a
# test reaching outside the repository (a sibling directory, say) fails here as it would in a clone.
STANDALONE_PKGS := ./internal/cli ./internal/config ./internal/policy ./internal/trace ./internal/sim
standalone: deps-go
	@dir=$$(mktemp -d /tmp/tierblk-standalone.XXXXXX) && trap 'rm -rf "$$dir"' EXIT && \
	  git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --ignore-failed-read 2>/dev/null | tar -xf - -C "$$dir" && \
	  echo "standalone: testing a copy of the tree in $$dir" && \
	  cd "$$dir" && $(GO) test -count=1 $(STANDALONE_PKGS)

# Every fuzz target for FUZZ_TIME: its seeds and testdata/fuzz corpus, then what the fuzzer finds.
# A failing input is written to the package's testdata/fuzz, where go test then replays it. A count
# of inputs, not a duration: Go 1.26's fuzzer can fail a target with "context deadline exceeded"
# when a duration ends while a worker is busy (golang/go#75804, fixed in Go 1.27).
FUZZ_TIME ?= 50000x
fuzz-short: deps-go
	@mkdir -p $(dir $(TESTLOG))
	@set -e; for file in $$(grep -rl --include='*_test.go' '^func Fuzz' internal pkg); do \
	  for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$file"); do \
	    echo "fuzz: $$target ($$(dirname $$file), $(FUZZ_TIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZ_TIME) ./$$(dirname $$file) > $(dir $(TESTLOG))fuzz.log 2>&1 || \
	      { cat $(dir $(TESTLOG))fuzz.log; exit 1; }; \
	  done; \
	done

unit: deps-go
	$(GO) test -race $$($(GO) list ./... | grep -v /integration)

integration: deps
	$(GO) test -race -timeout $(TEST_TIMEOUT) -v ./integration/...

# The crash campaign, an hour long and so not part of `make test`: the kill -9 tests run
# KILL_CYCLES cycles in each of their three cases (334: over 1,000 kills in all) and the VM test
# POWER_CUTS power cuts, each checked against the tests' models; the log goes to CAMPAIGNLOG, and
# the end prints each test's count of crashes and verified sectors, the totals, and the result.
# No -race: the tierblk that is killed is built by TestMain without it either way, so it would
# only slow the tests' own client and models (which `make test` runs under -race).
KILL_CYCLES ?= 334
POWER_CUTS ?= 100
CAMPAIGNLOG ?= $(CURDIR)/.cache/crash-campaign.log
CAMPAIGN_TESTS := TestWriteBackKill9|TestCacheKill9|TestWriteBackPowerCut
crash-campaign: deps
	@mkdir -p $(dir $(CAMPAIGNLOG))
	@echo "crash-campaign: $(KILL_CYCLES) kill -9 cycles in each of 3 cases, $(POWER_CUTS) power cuts; log: $(CAMPAIGNLOG)"
	@TIERBLK_KILL_CYCLES=$(KILL_CYCLES) TIERBLK_POWER_CUTS=$(POWER_CUTS) $(GO) test -count=1 -v -timeout 0 \
	  -run '^($(CAMPAIGN_TESTS))$$' ./integration/ > $(CAMPAIGNLOG) 2>&1; status=$$?; \
	  grep -o 'crash-campaign: .*' $(CAMPAIGNLOG) | awk '{ print; sectors += $$(NF-2); n++ } \
	    / kill -9 cycles, / { kills += $$3 } / power cuts, / { cuts += $$3 } \
	    END { printf "crash-campaign total: %d kill -9 cycles, %d power cuts, %.0f sectors verified\n", kills, cuts, sectors; \
	      exit (n != 4) }' || \
	  if [ $$status = 0 ]; then echo "crash-campaign: want a count from each of the 4 tests (3 kill cases, the power cuts)"; status=1; fi; \
	  if [ $$status != 0 ]; then echo "--- failures (whole log: $(CAMPAIGNLOG)):"; grep -A 25 -E -- '--- FAIL|^panic:' $(CAMPAIGNLOG) | head -n 300; fi; \
	  if [ $$status = 0 ]; then echo "crash-campaign: PASS"; else echo "crash-campaign: FAIL"; fi; \
	  exit $$status

# CACHESIM=/path/to/cachesim (libCacheSim, built outside this project) adds the comparison with it.
# BASELINE=/path/to/tierblk (an older build, e.g. from before the SSD tier's checksums) adds bench
# cache's checksums part: this build against that one and qemu-nbd (docs/benchmarks.md#checksums).
# bench nbd's iscsi part (against qemu-nbd over a tgtd LUN) runs only as root: tgtd needs it.
comma := ,
NBD_PARTS ?= plain$(comma)tls$(if $(filter 0,$(shell id -u)),$(comma)iscsi)
bench: deps build
	@case ",$(NBD_PARTS)," in *,iscsi,*) ;; *) echo "bench nbd: parts $(NBD_PARTS), no iscsi (tgtd needs root)";; esac
	$(BIN) bench nbd --parts $(NBD_PARTS)
	$(BIN) bench cache --work $(CURDIR)/.cache/bench-cache
	$(if $(BASELINE),$(BIN) bench cache --parts checksums --baseline $(BASELINE) --rounds 5 --work $(CURDIR)/.cache/bench-checksums)
	$(BIN) bench writeback --work $(CURDIR)/.cache/bench-writeback
	$(BIN) bench sim --work $(CURDIR)/.cache/bench-sim $(if $(CACHESIM),--cachesim $(CACHESIM))
	$(BIN) bench startup --work $(CURDIR)/.cache/bench-startup
	$(BIN) bench cold --work $(CURDIR)/.cache/bench-cold
	$(BIN) bench memory --work $(CURDIR)/.cache/bench-memory
	$(BIN) bench kernel
	$(BIN) bench replica --work $(CURDIR)/.cache/bench-replica

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi

deps: deps-deb deps-go

deps-go:
	@$(GO) mod download

deps-deb:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:" $$missing; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages: $$missing"; echo "run as root: apt-get install -y $$missing"; exit 1; \
	  fi; \
	fi

clean:
	rm -rf bin .cache
