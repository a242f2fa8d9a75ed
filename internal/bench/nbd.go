package bench

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// The parts of `tierblk bench nbd`: the same rows (DefaultRows) on tierblk and nbdkit over a unix
// socket, and over TCP with TLS; and tierblk against qemu-nbd, both serving a LUN of a tgtd over
// iSCSI (ISCSIRows).
const (
	NBDPlain = "plain"
	NBDTLS   = "tls"
	NBDISCSI = "iscsi"
)

// NBDParts are the parts, in the order they run.
func NBDParts() []string { return []string{NBDPlain, NBDTLS, NBDISCSI} }

// NBDDefaultParts are the parts `tierblk bench nbd` runs unless told: those that need no root.
// The iSCSI part's tgtd needs root (`make bench` adds it when run as root).
func NBDDefaultParts() []string { return []string{NBDPlain, NBDTLS} }

// The NBD benchmark's targets, as the table names them.
const (
	nameNBDTierblk = "tierblk"
	nameNBDKit     = "nbdkit"
	nameTGTD       = "tgtd"
)

// The iSCSI part's LUN: target 1 of its tgtd, LUN 1 on a sparse file of ISCSISize bytes.
const (
	ISCSIIQN  = "iqn.2026-11.org.tierblk:bench"
	ISCSISize = 1 << 30
)

// NBDSetup is one part's servers and how they are reached.
type NBDSetup struct {
	Targets []Target
	Rows    []Row
	// Transport says how fio reaches them, and Disk what they serve, for the table's caption.
	Transport, Disk string
	// Watch are the processes besides the servers whose CPU the run records (the iSCSI part's
	// tgtd).
	Watch []Watch
	// stop, if not nil, stops what the setup started besides the servers.
	stop func()
}

// Close stops what NBDTargets started besides the servers (the iSCSI part's tgtd), once the
// servers are stopped.
func (s NBDSetup) Close() {
	if s.stop != nil {
		s.stop()
	}
}

// NBDTargets sets up a part of `tierblk bench nbd`: for NBDPlain and NBDTLS, tierblk (the binary
// tierblk) serving mem://1GiB and nbdkit's memory plugin serving 1G; for NBDPlain on the run's
// unix sockets, for NBDTLS each on its own free TCP port of 127.0.0.1 requiring TLS, with a
// certificate WriteTLS writes into workDir/tls. For NBDISCSI it starts a tgtd on a free port of
// 127.0.0.1 serving a 1 GiB sparse file in workDir as LUN 1 of ISCSIIQN, and tierblk (no cache)
// and qemu-nbd serve that LUN on the run's unix sockets; Close stops the tgtd.
func NBDTargets(part, tierblk, workDir string) (NBDSetup, error) {
	switch part {
	case NBDPlain:
		return NBDSetup{Transport: "unix socket", Disk: "a 1 GiB RAM disk", Rows: DefaultRows(), Targets: []Target{
			{Name: nameNBDTierblk, Command: func(sock string) *exec.Cmd {
				return exec.Command(tierblk, "serve", "--backend", "mem://1GiB", "--nbd", "unix:"+sock, "--log-level", "warn")
			}},
			{Name: nameNBDKit, Command: func(sock string) *exec.Cmd {
				return exec.Command("nbdkit", "-f", "-U", sock, "memory", "1G")
			}},
		}}, nil
	case NBDTLS:
		dir := filepath.Join(workDir, "tls")
		if err := WriteTLS(dir); err != nil {
			return NBDSetup{}, fmt.Errorf("TLS certificates: %w", err)
		}
		ports, err := FreePorts(2)
		if err != nil {
			return NBDSetup{}, err
		}
		return NBDSetup{Transport: "TCP on 127.0.0.1 with " + TLSCipher, Disk: "a 1 GiB RAM disk", Rows: DefaultRows(),
			Targets: tlsTargets(tierblk, dir, ports)}, nil
	case NBDISCSI:
		if err := CheckISCSI(); err != nil {
			return NBDSetup{}, err
		}
		tgtd, err := startTGTD(workDir)
		if err != nil {
			return NBDSetup{}, err
		}
		url, err := tgtd.AddLUN(ISCSIIQN, filepath.Join(workDir, "lun.img"), ISCSISize)
		if err != nil {
			tgtd.Stop()
			return NBDSetup{}, err
		}
		return NBDSetup{Transport: "unix socket", Disk: "a tgtd LUN on a 1 GiB file over iSCSI on loopback TCP (" + url + ")",
			Rows: ISCSIRows(), Targets: iscsiTargets(tierblk, url), Watch: []Watch{{Name: nameTGTD, PID: tgtd.cmd.Process.Pid}},
			stop: tgtd.Stop}, nil
	}
	return NBDSetup{}, fmt.Errorf("unknown part %q of the NBD benchmark", part)
}

// CheckISCSI says what the iSCSI part lacks, before anything runs: root (for tgtd), tgtd, tgtadm
// or qemu-nbd. qemu-nbd without qemu's iSCSI driver shows only when it starts ("Unknown protocol
// 'iscsi'").
func CheckISCSI() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the iscsi part runs tgtd, which needs root (its control socket is in %s)", tgtdSocketDir)
	}
	for _, tool := range []struct{ name, pkg string }{
		{"tgtd", "tgt"}, {"tgtadm", "tgt"}, {"qemu-nbd", "qemu-utils and qemu-block-extra"},
	} {
		if _, err := exec.LookPath(tool.name); err != nil {
			return fmt.Errorf("%s is not installed; run `make deps` (Debian package %s)", tool.name, tool.pkg)
		}
	}
	return nil
}

// ISCSIRows are the iSCSI part's rows: DefaultRows, and 1M sequential writes, which reach the LUN's
// file where the other parts' reach a RAM disk.
func ISCSIRows() []Row {
	return append(DefaultRows(),
		Row{Name: "1M sequential write, QD8", FioArgs: []string{"--rw=write", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"})
}

// iscsiTargets are tierblk with no cache and qemu-nbd (with libiscsi, qemu's block-iscsi module)
// serving the iSCSI LUN at url on the run's unix sockets. qemu-nbd's --cache=none leaves writes
// without FUA (cache.writeback=on) as tierblk's are; -t serves client after client.
func iscsiTargets(tierblk, url string) []Target {
	return []Target{
		{Name: nameNBDTierblk, Command: func(sock string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", url, "--nbd", "unix:"+sock, "--log-level", "warn")
		}},
		{Name: nameQemuNBD, Command: func(sock string) *exec.Cmd {
			return exec.Command("qemu-nbd", "-t", "-f", "raw", "--cache=none", "-k", sock, url)
		}},
	}
}

// tlsTargets are tierblk and nbdkit requiring TLS with the certificates in dir, on ports[0] and
// ports[1] of 127.0.0.1. Neither checks clients' certificates (no --tls-verify-peer).
func tlsTargets(tierblk, dir string, ports []int) []Target {
	ep := func(port int) *Endpoint {
		return &Endpoint{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), TLSDir: dir}
	}
	tb, nk := ep(ports[0]), ep(ports[1])
	return []Target{
		{Name: nameNBDTierblk, Listen: tb, Command: func(string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", "mem://1GiB", "--nbd", tb.Addr,
				"--tls", "require", "--tls-certificates", dir, "--log-level", "warn")
		}},
		{Name: nameNBDKit, Listen: nk, Command: func(string) *exec.Cmd {
			return exec.Command("nbdkit", "-f", "-i", "127.0.0.1", "-p", strconv.Itoa(ports[1]),
				"--tls=require", "--tls-certificates="+dir, "memory", "1G")
		}},
	}
}

// Names are the names of the part's targets: tierblk, then its peer.
func (s NBDSetup) Names() []string {
	var names []string
	for _, t := range s.Targets {
		names = append(names, t.Name)
	}
	return names
}

// Table renders a part's results: each server's median, and the median of the per-round ratios
// tierblk/peer with their lowest and highest.
func (s NBDSetup) Table(w io.Writer, results []Result) {
	names := s.Names()
	pairedTable(w, results, names, [][2]string{{names[0], names[1]}})
}

// CPUTable renders what the CPUs did during each server's measurements (see CPUTable).
func (s NBDSetup) CPUTable(w io.Writer, results []Result) {
	var others []string
	for _, p := range s.Watch {
		others = append(others, p.Name)
	}
	CPUTable(w, results, s.Names(), others)
}
