package integration

// tgtd, the Linux SCSI target framework's user-space iSCSI target (Debian package tgt), as the
// real peer of the iSCSI backend (pkg/backend/iscsi): each test gets a tgtd of its own on a free
// loopback port with a control port of its own, and LUNs backed by files it creates.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
)

// tgtdServer is one running tgtd. Its methods take the testing.T of the (sub)test that calls them.
type tgtdServer struct {
	Addr    string // the iSCSI portal, 127.0.0.1:PORT
	control int    // tgtadm's --control-port
	nextTID int
	output  *nbdtest.Buffer
	// accounts are the CHAP accounts made so far, by user: an account is tgtd's, bound to targets.
	accounts map[string]string
	// targets are the targets made so far, which restart makes again.
	targets []tgtdTarget
	kill    func() // kills the running tgtd and waits for it
}

// tgtdTarget is one target as newTarget made it.
type tgtdTarget struct {
	tid int
	img string
	o   lunOptions
}

// tgtdControlPorts hands out control ports. tgtd listens for tgtadm on a Unix socket named after
// the port (/var/run/tgtd/socket.N), locked while a tgtd holds it: startTGTD skips ports in use.
var tgtdControlPorts atomic.Int32

func init() { tgtdControlPorts.Store(int32(20000 + os.Getpid()%5000)) }

// startTGTD runs tgtd in the foreground until the test ends.
func startTGTD(t *testing.T) *tgtdServer {
	t.Helper()
	requireTools(t, "tgtd", "tgtadm")
	for attempt := 0; ; attempt++ {
		srv := &tgtdServer{Addr: freeTCPAddr(t), control: int(tgtdControlPorts.Add(1)), output: &nbdtest.Buffer{},
			accounts: map[string]string{}}
		err := srv.start()
		if err == nil {
			t.Cleanup(func() {
				srv.kill()
				if t.Failed() {
					t.Logf("tgtd output:\n%s", srv.output.String())
				}
			})
			return srv
		}
		if attempt >= 5 {
			t.Fatalf("tgtd did not start: %v\n%s", err, srv.output.String())
		}
		// a port taken between choosing and binding it: another one
	}
}

// start runs tgtd on s's portal and control port, and sets s.kill.
func (s *tgtdServer) start() error {
	cmd := exec.Command("tgtd", "-f", "--iscsi", "portal="+s.Addr, "--control-port", strconv.Itoa(s.control))
	cmd.Stdout, cmd.Stderr = s.output, s.output
	// Its own process group, so that a kill takes its I/O threads with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	s.kill = func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			for _, f := range []string{"", ".lock"} { // its control socket, left behind by a kill
				os.Remove(fmt.Sprintf("/var/run/tgtd/socket.%d%s", s.control, f))
			}
		})
	}
	if err := s.waitReady(exited); err != nil {
		s.kill()
		return err
	}
	return nil
}

// restart kills tgtd (SIGKILL, as a crash would) and starts it again on the same portal, with the
// same targets and accounts; down is how long the portal stays dark.
func (s *tgtdServer) restart(t *testing.T, down time.Duration) {
	t.Helper()
	s.kill()
	time.Sleep(down)
	require.NoError(t, s.start(), "tgtd restart\n%s", s.output.String())
	accounts := s.accounts
	s.accounts = map[string]string{}
	for user, password := range accounts {
		s.account(t, user, password)
	}
	for _, tg := range s.targets {
		s.configure(t, tg)
	}
}

// waitReady waits until tgtd answers tgtadm and accepts iSCSI connections.
func (s *tgtdServer) waitReady(exited chan error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("tgtd exited: %v", err)
		default:
		}
		if _, err := s.adm("--op", "show", "--mode", "target"); err == nil {
			if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on control port %d and portal %s", s.control, s.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adm runs tgtadm on this tgtd's control port.
func (s *tgtdServer) adm(args ...string) (string, error) {
	out, err := exec.Command("tgtadm", append([]string{"-C", strconv.Itoa(s.control), "--lld", "iscsi"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tgtadm %v: %v: %s", args, err, out)
	}
	return string(out), nil
}

func (s *tgtdServer) mustAdm(t *testing.T, args ...string) {
	t.Helper()
	_, err := s.adm(args...)
	require.NoError(t, err)
}

// lunOptions shape a new target's LUN 1.
type lunOptions struct {
	thin     bool   // thin provisioning: UNMAP and WRITE SAME with UNMAP
	readOnly bool   // a write-protected LUN
	user     string // a CHAP account the target requires (with password)
	password string
	// targetUser and targetPassword make the target prove itself (mutual CHAP).
	targetUser, targetPassword string
	blockSize                  int  // 0: tgtd's 512
	digests                    bool // accept only CRC32C header and data digests
}

// newTarget adds a target whose LUN 1 is the file img, and returns its name.
func (s *tgtdServer) newTarget(t *testing.T, img string, o lunOptions) string {
	t.Helper()
	s.nextTID++
	tg := tgtdTarget{tid: s.nextTID, img: img, o: o}
	s.targets = append(s.targets, tg)
	return s.configure(t, tg)
}

// configure makes target tg in tgtd, and returns its name.
func (s *tgtdServer) configure(t *testing.T, tg tgtdTarget) string {
	t.Helper()
	tid, o := strconv.Itoa(tg.tid), tg.o
	iqn := fmt.Sprintf("iqn.2026-01.test.tierblk:t%d", tg.tid)
	s.mustAdm(t, "--op", "new", "--mode", "target", "--tid", tid, "-T", iqn)
	lu := []string{"--op", "new", "--mode", "logicalunit", "--tid", tid, "--lun", "1", "-b", tg.img}
	if o.blockSize != 0 {
		lu = append(lu, "--blocksize", strconv.Itoa(o.blockSize))
	}
	s.mustAdm(t, lu...)
	if o.thin {
		s.mustAdm(t, "--op", "update", "--mode", "logicalunit", "--tid", tid, "--lun", "1", "--params", "thin_provisioning=1")
	}
	if o.readOnly {
		s.mustAdm(t, "--op", "update", "--mode", "logicalunit", "--tid", tid, "--lun", "1", "--params", "readonly=1")
	}
	if o.user != "" {
		s.account(t, o.user, o.password)
		s.mustAdm(t, "--op", "bind", "--mode", "account", "--tid", tid, "--user", o.user)
	}
	if o.targetUser != "" {
		s.account(t, o.targetUser, o.targetPassword)
		s.mustAdm(t, "--op", "bind", "--mode", "account", "--tid", tid, "--user", o.targetUser, "--outgoing")
	}
	if o.digests {
		for _, d := range []string{"HeaderDigest", "DataDigest"} {
			s.mustAdm(t, "--op", "update", "--mode", "target", "--tid", tid, "--name", d, "--value", "CRC32C")
		}
	}
	s.mustAdm(t, "--op", "bind", "--mode", "target", "--tid", tid, "-I", "ALL")
	return iqn
}

// account makes a CHAP account, once per user.
func (s *tgtdServer) account(t *testing.T, user, password string) {
	t.Helper()
	if p, ok := s.accounts[user]; ok {
		require.Equal(t, password, p, "tgtd account %s made with another password", user)
		return
	}
	s.mustAdm(t, "--op", "new", "--mode", "account", "--user", user, "--password", password)
	s.accounts[user] = password
}

// newLUN creates a file of size bytes (zeroes) for a new target and returns the iSCSI URL of its
// LUN 1 and the file.
func (s *tgtdServer) newLUN(t *testing.T, size int64, o lunOptions) (string, string) {
	t.Helper()
	img := filepath.Join(shortTempDir(t), "lun.img") // tgtadm's parameters are split at commas, which test names have
	f, err := os.Create(img)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	return fmt.Sprintf("iscsi://%s/%s/1", s.Addr, s.newTarget(t, img, o)), img
}
