// Package nbdbackend opens an export of a remote NBD server as a backend.Backend, from the URI
// forms of doc/uri.md of the NBD project: nbd://HOST[:PORT]/EXPORT over TCP (port 10809 by
// default) and nbd+unix:///EXPORT?socket=PATH over a Unix socket, each with an optional
// connections=N query and a reconnect-wait=DURATION one (how long a request waits for a dropped
// connection to come back before it fails, 1m by default); nbds:// and nbds+unix:// are the same over TLS, with libnbd's queries
// tls-certificates=DIR (internal/tlsconf's layout), tls-verify-peer and tls-hostname.
//
// It is a thin layer over the client in internal/nbd/client, which pipelines requests, splits
// large ones and reconnects. It must never claim an ability the server lacks: without the
// server's TRIM or WRITE_ZEROES the call fails with backend.ErrNotSupported (so the volume above
// emulates or skips it), never with a silent success; and never speak in plain to a server that a
// URL asking for TLS names.
package nbdbackend

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Example URLs of the schemes, for help texts and error messages.
const (
	Usage        = "nbd://HOST[:PORT]/EXPORT[?connections=N][&reconnect-wait=DURATION]"
	UnixUsage    = "nbd+unix:///EXPORT?socket=PATH[&connections=N][&reconnect-wait=DURATION]"
	TLSUsage     = "nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR][&tls-verify-peer=false][&tls-hostname=NAME][&connections=N][&reconnect-wait=DURATION]"
	TLSUnixUsage = "nbds+unix:///EXPORT?socket=PATH[&tls-certificates=DIR][&tls-verify-peer=false][&tls-hostname=NAME][&connections=N][&reconnect-wait=DURATION]"
)

// maxConnections bounds connections=N: more connections than this only cost the server threads.
const maxConnections = 64

// usages are the example URLs by scheme.
var usages = map[string]string{"nbd": Usage, "nbd+unix": UnixUsage, "nbds": TLSUsage, "nbds+unix": TLSUnixUsage}

// clientConfig turns an NBD URL into a client configuration (without a logger or timeouts), and
// the TLS it asks for: nil for none, else what to load its configuration from.
func clientConfig(u *url.URL) (client.Config, *tlsconf.Options, error) {
	var cfg client.Config
	usage, known := usages[u.Scheme]
	if !known {
		usage = Usage
	}
	bad := func(format string, args ...any) (client.Config, *tlsconf.Options, error) {
		return client.Config{}, nil, fmt.Errorf("nbd URL %q: %s; use %s", u.Redacted(), fmt.Sprintf(format, args...), usage)
	}
	if !known {
		return bad("scheme %q is not nbd, nbd+unix, nbds or nbds+unix", u.Scheme)
	}
	if u.Opaque != "" {
		return bad("expected %s:// followed by a host or a third slash", u.Scheme)
	}
	if u.User != nil {
		return bad("user names are for TLS with pre-shared keys, which is not offered (Go's TLS has none); use X.509 certificates")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query: %v", err)
	}
	for k, v := range q {
		if len(v) != 1 {
			return bad("%s= is given %d times", k, len(v))
		}
	}
	cfg.Export = strings.TrimPrefix(u.Path, "/")

	if !strings.HasSuffix(u.Scheme, "+unix") {
		if u.Host == "" {
			return bad("no host")
		}
		if _, ok := q["socket"]; ok {
			return bad("socket= needs the nbd+unix or nbds+unix scheme")
		}
		port := u.Port()
		if port == "" {
			port = strconv.Itoa(proto.DefaultPort)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return bad("port %q is not a number from 1 to 65535", port)
		}
		cfg.Network, cfg.Address = "tcp", net.JoinHostPort(u.Hostname(), port)
	} else {
		if u.Host != "" {
			return bad("a Unix socket URL takes no host (%q): put three slashes after the scheme", u.Host)
		}
		if q.Get("socket") == "" {
			return bad("no socket= path")
		}
		cfg.Network, cfg.Address = "unix", q.Get("socket")
	}
	delete(q, "socket")

	if v, ok := q["connections"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > maxConnections {
			return bad("connections=%s is not a number from 1 to %d", v[0], maxConnections)
		}
		cfg.Connections = n
		delete(q, "connections")
	}
	if v, ok := q["reconnect-wait"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < time.Second {
			return bad("reconnect-wait=%s is not a duration of at least 1s (e.g. 10s; default 1m)", v[0])
		}
		cfg.MaxReconnectWait = d
		delete(q, "reconnect-wait")
	}
	var tlsOpts *tlsconf.Options
	if strings.HasPrefix(u.Scheme, "nbds") {
		// libnbd's defaults: check the server's certificate, for the URL's host if it has one.
		tlsOpts = &tlsconf.Options{Dir: q.Get("tls-certificates"), VerifyPeer: true, Hostname: u.Hostname()}
		if _, ok := q["tls-certificates"]; ok && tlsOpts.Dir == "" {
			return bad("tls-certificates= is empty; give the directory of ca-cert.pem, client-cert.pem and client-key.pem")
		}
		if v, ok := q["tls-verify-peer"]; ok {
			b, err := strconv.ParseBool(v[0])
			if err != nil {
				return bad("tls-verify-peer=%s is not true or false", v[0])
			}
			tlsOpts.VerifyPeer = b
		}
		if v, ok := q["tls-hostname"]; ok {
			tlsOpts.Hostname = v[0]
		}
		delete(q, "tls-certificates")
		delete(q, "tls-verify-peer")
		delete(q, "tls-hostname")
	}
	if _, ok := q["tls-psk-file"]; ok {
		return bad("tls-psk-file: pre-shared keys are not offered (Go's TLS has none); use X.509 certificates with tls-certificates=DIR")
	}
	if len(q) > 0 {
		var unknown []string
		for k := range q {
			unknown = append(unknown, k)
		}
		sort.Strings(unknown)
		if tlsOpts == nil && strings.HasPrefix(unknown[0], "tls-") {
			return bad("%s= is for TLS, which the %s scheme does not ask for (%s does)", unknown[0], u.Scheme,
				strings.Replace(u.Scheme, "nbd", "nbds", 1))
		}
		return bad("unknown query parameter %s", strings.Join(unknown, ", "))
	}
	return cfg, tlsOpts, nil
}

// Open connects to the export the URL names. It matches backend.Factory.
func Open(u *url.URL, opts backend.Options) (backend.Backend, error) {
	cfg, tlsOpts, err := clientConfig(u)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	if tlsOpts != nil {
		if cfg.TLS, err = tlsconf.Client(*tlsOpts); err != nil {
			return nil, fmt.Errorf("nbd URL %q: TLS: %w", u.Redacted(), err)
		}
	}
	cfg.Logger = opts.Logger
	c, err := client.Dial(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	return &Backend{c: c, readOnly: opts.ReadOnly || c.ReadOnly()}, nil
}

// Backend is an NBD export. It implements backend.Backend, AsyncReader, Trimmer, ZeroWriter,
// FUAWriter and ReadOnlyReporter.
type Backend struct {
	c        *client.Client
	readOnly bool // opened read-only, or the server exports read-only
}

func (b *Backend) check(op string) error {
	if b.readOnly {
		return fmt.Errorf("%w: %s on an NBD export opened read-only", backend.ErrReadOnly, op)
	}
	return nil
}

// ReadAt implements backend.Backend.
func (b *Backend) ReadAt(p []byte, off int64) (int, error) { return b.c.ReadAt(p, off) }

// ReadAtAsync implements backend.AsyncReader (client.Client.ReadAtAsync).
func (b *Backend) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	return b.c.ReadAtAsync(p, off, done)
}

// WriteAt implements backend.Backend.
func (b *Backend) WriteAt(p []byte, off int64) (int, error) {
	if err := b.check("write"); err != nil {
		return 0, err
	}
	return b.c.WriteAt(p, off)
}

// WriteAtFUA implements backend.FUAWriter; a server without FUA gets a write and a flush.
func (b *Backend) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := b.check("write"); err != nil {
		return 0, err
	}
	return b.c.WriteAtFUA(p, off)
}

// Size implements backend.Backend.
func (b *Backend) Size() int64 { return b.c.Size() }

// Flush implements backend.Backend.
func (b *Backend) Flush() error { return b.c.Flush() }

// Trim implements backend.Trimmer. It fails with backend.ErrNotSupported if the server cannot trim.
func (b *Backend) Trim(off, length int64) error {
	if err := b.check("trim"); err != nil {
		return err
	}
	return b.c.Trim(off, length)
}

// WriteZeroes implements backend.ZeroWriter. It fails with backend.ErrNotSupported if the server
// cannot write zeroes, so the caller writes them as data.
func (b *Backend) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := b.check("write-zeroes"); err != nil {
		return err
	}
	return b.c.WriteZeroes(off, length, mayUnmap)
}

// ReadOnly implements backend.ReadOnlyReporter.
func (b *Backend) ReadOnly() bool { return b.readOnly }

// Waits implements backend.Waiter: every request goes over the network.
func (b *Backend) Waits() uint64 { return b.c.Waits() }

// Close disconnects from the server. It does not flush.
func (b *Backend) Close() error { return b.c.Close() }
