package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The few NBD wire values the raw client below needs, written from the protocol document
// (doc/proto.md of NetworkBlockDevice/nbd) rather than taken from tierblk's own package, so the
// test checks the server against the specification and not against itself.
const (
	wireMagicNBD     = 0x4e42444d41474943 // "NBDMAGIC"
	wireMagicOpt     = 0x49484156454f5054 // "IHAVEOPT"
	wireMagicRequest = 0x25609513
	wireMagicReply   = 0x67446698
	wireOptExport    = 1 // NBD_OPT_EXPORT_NAME
	wireCmdRead      = 0
	wireCmdWrite     = 1
	wireCmdTrim      = 4
	wireCmdZeroes    = 6
	wireEPERM        = 1
)

// rawConn is an NBD connection driven byte by byte, to send what no well-behaved client would.
type rawConn struct {
	t        *testing.T
	c        net.Conn
	noZeroes bool
}

// dialRaw connects and reads the server's greeting, stopping before the client flags.
func dialRaw(t *testing.T, network, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute)))
	var greeting struct {
		Magic, Opt uint64
		Flags      uint16
	}
	require.NoError(t, binary.Read(c, binary.BigEndian, &greeting))
	require.Equal(t, uint64(wireMagicNBD), greeting.Magic)
	require.Equal(t, uint64(wireMagicOpt), greeting.Opt, "fixed newstyle greeting")
	require.NotZero(t, greeting.Flags&1, "NBD_FLAG_FIXED_NEWSTYLE")
	return &rawConn{t: t, c: c, noZeroes: greeting.Flags&2 != 0}
}

func (r *rawConn) write(v any) {
	r.t.Helper()
	require.NoError(r.t, binary.Write(r.c, binary.BigEndian, v))
}

// exportName completes the handshake with NBD_OPT_EXPORT_NAME and returns the export's size.
func (r *rawConn) exportName(name string) uint64 {
	r.t.Helper()
	clientFlags := uint32(1) // NBD_FLAG_C_FIXED_NEWSTYLE
	if r.noZeroes {
		clientFlags |= 2 // NBD_FLAG_C_NO_ZEROES
	}
	r.write(clientFlags)
	r.write(struct {
		Magic    uint64
		Opt, Len uint32
	}{wireMagicOpt, wireOptExport, uint32(len(name))})
	r.write([]byte(name))
	var info struct {
		Size  uint64
		Flags uint16
	}
	require.NoError(r.t, binary.Read(r.c, binary.BigEndian, &info))
	if !r.noZeroes {
		_, err := io.CopyN(io.Discard, r.c, 124)
		require.NoError(r.t, err)
	}
	return info.Size
}

// request sends a request header (and no payload).
func (r *rawConn) request(cmd uint16, cookie, offset uint64, length uint32) {
	r.t.Helper()
	r.write(struct {
		Magic      uint32
		Flags, Cmd uint16
		Cookie     uint64
		Offset     uint64
		Length     uint32
	}{wireMagicRequest, 0, cmd, cookie, offset, length})
}

// reply reads a simple reply for cookie and returns its error value.
func (r *rawConn) reply(cookie uint64) uint32 {
	r.t.Helper()
	var rep struct {
		Magic, Err uint32
		Cookie     uint64
	}
	require.NoError(r.t, binary.Read(r.c, binary.BigEndian, &rep))
	require.Equal(r.t, uint32(wireMagicReply), rep.Magic)
	require.Equal(r.t, cookie, rep.Cookie)
	return rep.Err
}

func TestClientDisconnectMidRequest(t *testing.T) {
	requireTools(t, "qemu-io")
	d := startServe(t, "--backend", "mem://64MiB")

	// A well-behaved client keeps writing and verifying its own region meanwhile.
	var cmds []string
	for i := range 64 {
		off := fmt.Sprintf("%d", 8<<20+i*65536)
		cmds = append(cmds, fmt.Sprintf("write -P %d %s 64k", i+1, off), fmt.Sprintf("read -P %d %s 64k", i+1, off))
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := qemuIO(t, tcpURI(d.TCP, ""), cmds...)
		done <- result{out, err}
	}()

	// Each cut leaves the server with a connection that ends in the middle of something; the
	// write it may have begun targets [0, 64k), which must stay zero.
	cuts := []struct {
		name string
		cut  func(r *rawConn)
	}{
		{"in the greeting", func(*rawConn) {}},
		{"in the option header", func(r *rawConn) { r.write(uint32(3)); r.write(uint64(wireMagicOpt)) }},
		{"in the request header", func(r *rawConn) { r.exportName(""); r.write(uint32(wireMagicRequest)) }},
		{"before the write payload", func(r *rawConn) { r.exportName(""); r.request(wireCmdWrite, 1, 0, 65536) }},
		{"in the write payload", func(r *rawConn) {
			r.exportName("")
			r.request(wireCmdWrite, 1, 0, 65536)
			r.write(bytes.Repeat([]byte{0xee}, 32768))
		}},
	}
	// Cut connections while qemu-io runs (bounded), and at least a few rounds.
	var res result
	finished := false
	for round := 0; round < 4 || (!finished && round < 200); round++ {
		for _, c := range cuts {
			network, addr := "unix", d.Unix
			if round%2 == 1 {
				network, addr = "tcp", d.TCP
			}
			r := dialRaw(t, network, addr)
			c.cut(r)
			require.NoError(t, r.c.Close(), "round %d, cut %s", round, c.name)
		}
		select {
		case res = <-done:
			finished = true
		default:
		}
	}
	if !finished {
		res = <-done
	}
	require.NoError(t, res.err, "the concurrent qemu-io failed:\n%s", res.out)
	require.NotContains(t, res.out, "failed")
	// Nothing of the cut-off writes reached the disk, and new clients are still served.
	for _, tr := range transports {
		mustQemuIO(t, tr.uri(d, ""), "read -P 0 0 64k", fmt.Sprintf("read -P 64 %d 64k", 12<<20-65536))
	}
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	d := startServe(t, "--backend", "mem://16MiB", "--read-only")
	r := dialRaw(t, "unix", d.Unix)
	require.Equal(t, uint64(16<<20), r.exportName(""))
	cmds := []struct {
		name    string
		cmd     uint16
		payload bool
	}{
		{"write", wireCmdWrite, true},
		{"trim", wireCmdTrim, false},
		{"write zeroes", wireCmdZeroes, false},
	}
	for i, c := range cmds {
		cookie := uint64(100 + i)
		r.request(c.cmd, cookie, 0, 4096)
		if c.payload {
			r.write(bytes.Repeat([]byte{0x55}, 4096))
		}
		require.Equal(t, uint32(wireEPERM), r.reply(cookie), "%s on a read-only export", c.name)
	}
	// The connection still works and the data is unchanged.
	r.request(wireCmdRead, 7, 0, 4096)
	require.Zero(t, r.reply(7))
	data := make([]byte, 4096)
	_, err := io.ReadFull(r.c, data)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 4096), data)
}

func TestGracefulStop(t *testing.T) {
	requireTools(t, "qemu-io", "fio")
	tests := []struct {
		name string
		sig  syscall.Signal
		load bool // stop while fio keeps requests in flight on other connections
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGINT", syscall.SIGINT, false},
		{"SIGTERM under load", syscall.SIGTERM, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "disk.img")
			d := startServe(t, "--backend", "file://"+img+"?size=16MiB")
			mustQemuIO(t, unixURI(d.Unix, ""),
				"write -P 0xab 0 64k",
				"write -z 0 4k",
				"write -P 0xcd 1M 4k",
				fmt.Sprintf("write -P 0xef %d 4k", 16<<20-4096))
			fioDone := make(chan struct{})
			if tt.load {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				fio := exec.CommandContext(ctx, "fio", "--name=load", "--ioengine=nbd", "--uri="+tcpURI(d.TCP, ""),
					"--rw=randrw", "--bs=4k", "--iodepth=32", "--numjobs=2", "--offset=8m", "--size=4m",
					"--time_based", "--runtime=60")
				require.NoError(t, fio.Start())
				go func() { _ = fio.Wait(); close(fioDone) }() // fio fails when the server goes away
				waitConnections(t, d, 2)
			} else {
				close(fioDone)
			}
			d.requireStop(tt.sig)
			<-fioDone

			data, err := os.ReadFile(img)
			require.NoError(t, err)
			require.Len(t, data, 16<<20)
			want := make([]byte, 16<<20)
			copy(want[4096:65536], bytes.Repeat([]byte{0xab}, 65536-4096))
			copy(want[1<<20:], bytes.Repeat([]byte{0xcd}, 4096))
			copy(want[16<<20-4096:], bytes.Repeat([]byte{0xef}, 4096))
			if tt.load {
				copy(data[8<<20:12<<20], want[8<<20:12<<20]) // whatever fio wrote there
			}
			require.True(t, bytes.Equal(want, data), "the backing file does not hold what was written")
			var st syscall.Stat_t
			require.NoError(t, syscall.Stat(img, &st))
			require.Less(t, st.Blocks*512, int64(16<<20), "a backing file created with ?size= must be sparse")
		})
	}
}

// waitConnections waits until the daemon has at least n established TCP connections, found in
// /proc/net/tcp by its listening port: a way to know fio is connected without a fixed sleep.
func waitConnections(t *testing.T, d *daemon, n int) {
	t.Helper()
	_, port, err := net.SplitHostPort(d.TCP)
	require.NoError(t, err)
	var p int
	_, err = fmt.Sscan(port, &p)
	require.NoError(t, err)
	local := fmt.Sprintf(":%04X ", p)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		table, err := os.ReadFile("/proc/net/tcp")
		require.NoError(t, err)
		count := 0
		for _, line := range strings.Split(string(table), "\n") {
			f := strings.Fields(line)
			// Fields: sl local_address rem_address st ...; 01 is ESTABLISHED.
			if len(f) > 3 && strings.HasSuffix(f[1]+" ", local) && f[3] == "01" {
				count++
			}
		}
		if count >= n {
			return
		}
	}
	t.Fatalf("fewer than %d clients connected to %s within 30s", n, d.TCP)
}

func TestNBDBackend(t *testing.T) {
	requireTools(t, "nbdkit", "qemu-io", "nbdinfo")
	tests := []struct {
		name string
		// start runs nbdkit and returns tierblk's backend URL and a URI to read nbdkit directly.
		start func(t *testing.T) (backend, direct string)
	}{
		{"nbd+unix", func(t *testing.T) (string, string) {
			sock := filepath.Join(shortTempDir(t), "nbdkit.sock")
			startDaemon(t, "nbdkit", []string{"-f", "-U", sock, "memory", "64M"}, "unix:"+sock)
			return unixURI(sock, ""), unixURI(sock, "")
		}},
		{"nbd", func(t *testing.T) (string, string) {
			addr := freeTCPAddr(t)
			_, port, _ := net.SplitHostPort(addr)
			startDaemon(t, "nbdkit", []string{"-f", "-i", "127.0.0.1", "-p", port, "memory", "64M"}, addr)
			return tcpURI(addr, ""), tcpURI(addr, "")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backend, direct := tt.start(t)
			d := startServe(t, "--backend", backend)
			exports := nbdInfo(t, unixURI(d.Unix, ""), false)
			require.Equal(t, int64(64<<20), exports[0].Size)
			mustQemuIO(t, tcpURI(d.TCP, ""),
				"write -P 0x42 0 1M",
				"write -z 64k 64k",
				"write -f -P 0x43 32M 128k",
				"discard 48M 1M",
				"read -P 0x42 0 64k",
				"read -P 0 64k 64k",
				"read -P 0x42 128k 896k",
				"read -P 0x43 32M 128k")
			d.requireStop(syscall.SIGTERM)
			// After a clean stop, the remote server holds everything.
			mustQemuIO(t, direct, "read -P 0x42 0 64k", "read -P 0 64k 64k", "read -P 0x42 128k 896k", "read -P 0x43 32M 128k")
		})
	}
}
