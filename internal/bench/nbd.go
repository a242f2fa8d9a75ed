package bench

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
)

// The parts of `tierblk bench nbd`: the same rows (DefaultRows) on tierblk and nbdkit over a unix
// socket, and over TCP with TLS.
const (
	NBDPlain = "plain"
	NBDTLS   = "tls"
)

// NBDParts are the parts, in the order they run.
func NBDParts() []string { return []string{NBDPlain, NBDTLS} }

// The NBD benchmark's targets, as the table names them.
const (
	nameNBDTierblk = "tierblk"
	nameNBDKit     = "nbdkit"
)

// NBDSetup is one part's servers and how they are reached.
type NBDSetup struct {
	Targets []Target
	// Transport says how fio reaches them, for the table's caption.
	Transport string
}

// NBDTargets sets up a part of `tierblk bench nbd`: tierblk (the binary tierblk) serving
// mem://1GiB and nbdkit's memory plugin serving 1G; for NBDPlain on the run's unix sockets, for
// NBDTLS each on its own free TCP port of 127.0.0.1 requiring TLS, with a certificate WriteTLS
// writes into workDir/tls.
func NBDTargets(part, tierblk, workDir string) (NBDSetup, error) {
	switch part {
	case NBDPlain:
		return NBDSetup{Transport: "unix socket", Targets: []Target{
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
		return NBDSetup{Transport: "TCP on 127.0.0.1 with " + TLSCipher, Targets: tlsTargets(tierblk, dir, ports)}, nil
	}
	return NBDSetup{}, fmt.Errorf("unknown part %q of the NBD benchmark", part)
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

// NBDTable renders a part's results: each server's median, and the median of the per-round
// ratios tierblk/nbdkit with their lowest and highest.
func NBDTable(w io.Writer, results []Result) {
	pairedTable(w, results, []string{nameNBDTierblk, nameNBDKit}, [][2]string{{nameNBDTierblk, nameNBDKit}})
}
