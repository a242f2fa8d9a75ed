package integration

// Tests of the iSCSI backend (pkg/backend/iscsi) against tgtd: the backend conformance suite on
// thin-provisioned and fully provisioned LUNs, with and without digests; CHAP with the right and
// wrong secrets; a write-protected LUN. The backend is opened by URL through the daemon's registry,
// as `tierblk serve --backend` opens it.

import (
	"testing"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
)

func TestISCSIBackendConformance(t *testing.T) {
	srv := startTGTD(t)
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		u, _ := srv.newLUN(t, size, lunOptions{thin: true})
		return openBackend(t, u, backend.Options{})
	})
}
