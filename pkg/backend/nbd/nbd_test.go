package nbdbackend_test

// The backend's tests against a real server (nbdkit) are in integration/nbdbackend_test.go.

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/pkg/backend"
	nbdbackend "github.com/tierblk/tierblk/pkg/backend/nbd"
)

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want client.Config
		tls  *tlsconf.Options
		err  string // part of the error; "" for a good URL
	}{
		{url: "nbd://nas:10810/disk", want: client.Config{Network: "tcp", Address: "nas:10810", Export: "disk"}},
		{url: "nbd://nas/disk", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "disk"}},
		{url: "nbd://nas", want: client.Config{Network: "tcp", Address: "nas:10809"}},
		{url: "nbd://nas/", want: client.Config{Network: "tcp", Address: "nas:10809"}},
		{url: "nbd://nas//disk", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "/disk"}},
		{url: "nbd://nas/hello%20world", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "hello world"}},
		{url: "nbd://[::1]:9000/x", want: client.Config{Network: "tcp", Address: "[::1]:9000", Export: "x"}},
		{url: "nbd://10.0.0.1/x?connections=4", want: client.Config{Network: "tcp", Address: "10.0.0.1:10809", Export: "x", Connections: 4}},
		{url: "nbd://10.0.0.1/x?reconnect-wait=10s", want: client.Config{Network: "tcp", Address: "10.0.0.1:10809", Export: "x", MaxReconnectWait: 10 * time.Second}},
		{url: "nbd+unix:///disk?socket=/run/nbd.sock", want: client.Config{Network: "unix", Address: "/run/nbd.sock", Export: "disk"}},
		{url: "nbd+unix:///?socket=nbd.sock&connections=2", want: client.Config{Network: "unix", Address: "nbd.sock", Connections: 2}},
		{url: "nbds://nas/disk", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "disk"},
			tls: &tlsconf.Options{VerifyPeer: true, Hostname: "nas"}},
		{url: "nbds://10.0.0.1:10810/disk?tls-certificates=/etc/pki/x&connections=2",
			want: client.Config{Network: "tcp", Address: "10.0.0.1:10810", Export: "disk", Connections: 2},
			tls:  &tlsconf.Options{Dir: "/etc/pki/x", VerifyPeer: true, Hostname: "10.0.0.1"}},
		{url: "nbds://nas/disk?tls-verify-peer=false&tls-hostname=nas.example", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "disk"},
			tls: &tlsconf.Options{Hostname: "nas.example"}},
		{url: "nbds+unix:///disk?socket=/run/nbd.sock&tls-certificates=pki", want: client.Config{Network: "unix", Address: "/run/nbd.sock", Export: "disk"},
			tls: &tlsconf.Options{Dir: "pki", VerifyPeer: true}},
		{url: "nbds+unix:///?socket=/s&tls-hostname=nas&tls-verify-peer=1", want: client.Config{Network: "unix", Address: "/s"},
			tls: &tlsconf.Options{VerifyPeer: true, Hostname: "nas"}},

		{url: "nbd:///disk", err: "no host; use nbd://HOST[:PORT]/EXPORT"},
		{url: "nbd:nas:10809", err: "expected nbd:// followed by"},
		{url: "nbd://nas:0/x", err: `port "0"`},
		{url: "nbd://nas:99999/x", err: `port "99999"`},
		{url: "nbd://nas/x?socket=/s", err: "socket= needs the nbd+unix or nbds+unix scheme"},
		{url: "nbd://user@nas/x", err: "user names are for TLS with pre-shared keys, which is not offered"},
		{url: "nbds://user@nas/x", err: "user names are for TLS with pre-shared keys"},
		{url: "nbds:///x", err: "no host; use nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR]"},
		{url: "nbds+unix:///x", err: "no socket= path; use nbds+unix:///EXPORT?socket=PATH"},
		{url: "nbds://nas/x?tls-verify-peer=maybe", err: "tls-verify-peer=maybe is not true or false"},
		{url: "nbds://nas/x?tls-certificates=", err: "tls-certificates= is empty"},
		{url: "nbds://nas/x?tls-psk-file=/k", err: "tls-psk-file: pre-shared keys are not offered"},
		{url: "nbd://nas/x?tls-certificates=/d", err: "tls-certificates= is for TLS, which the nbd scheme does not ask for (nbds does)"},
		{url: "nbd+unix:///x?socket=/s&tls-hostname=h", err: "tls-hostname= is for TLS, which the nbd+unix scheme does not ask for (nbds+unix does)"},
		{url: "file:///x", err: `scheme "file"`},
		{url: "nbd+unix:///disk", err: "no socket= path; use nbd+unix:///EXPORT?socket=PATH"},
		{url: "nbd+unix://host/disk?socket=/s", err: "takes no host"},
		{url: "nbd://nas/x?connections=0", err: "connections=0 is not a number from 1 to 64"},
		{url: "nbd://nas/x?reconnect-wait=5", err: "reconnect-wait=5 is not a duration of at least 1s"},
		{url: "nbd://nas/x?reconnect-wait=100ms", err: "reconnect-wait=100ms is not a duration of at least 1s"},
		{url: "nbd://nas/x?connections=many", err: "connections=many"},
		{url: "nbd://nas/x?connections=1&connections=2", err: "connections= is given 2 times"},
		{url: "nbds://nas/x?tls-type=x509&zz=1", err: "unknown query parameter tls-type, zz"},
		{url: "nbd://nas/x?tls-type=x509&zz=1", err: "tls-type= is for TLS, which the nbd scheme does not ask for (nbds does)"},
		{url: "nbd://nas/x?a=%zz", err: "query"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			require.NoError(t, err)
			got, tls, err := nbdbackend.ClientConfig(u)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.tls, tls)
		})
	}
}

// A URL asking for TLS whose certificates cannot be loaded fails before any connection, saying
// which file is wrong.
func TestOpenTLSWithoutCertificates(t *testing.T) {
	u, err := url.Parse("nbds+unix:///?socket=/nonexistent.sock&tls-certificates=" + t.TempDir())
	require.NoError(t, err)
	_, err = nbdbackend.Open(u, backend.Options{})
	require.ErrorContains(t, err, "ca-cert.pem is missing")
}
