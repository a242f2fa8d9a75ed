package iscsi

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
)

// onCommand makes lun call fn before each command of opcode op, until fn returns false.
func onCommand(lun *fakeLUN, op byte, fn func() bool) {
	var mu sync.Mutex
	active := true
	f := func(cdb []byte) {
		mu.Lock()
		defer mu.Unlock()
		if active && cdb[0] == op {
			active = fn()
		}
	}
	lun.before.Store(&f)
}

// A connection lost in the middle of commands: the backend logs in again and runs them again, and
// their callers see only success.
func TestLinkReissuesCommandsInFlight(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	b, links, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)

	drops := 0
	onCommand(lun, scsiWrite16, func() bool {
		drops++
		links.drop()
		return drops < 3 // the first three writes the target sees are cut off
	})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, err := b.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), int64(i)*4096)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, 3, drops)
	require.EqualValues(t, 3, b.l.reconnects.Load(), "a new session for each connection lost")
	for i := range 8 {
		got := make([]byte, 4096)
		_, err := b.ReadAt(got, int64(i)*4096)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{byte(i + 1)}, 4096), got)
	}
}

// A session that ends with acknowledged writes no flush covered may have taken them with it (a
// target that restarted loses its volatile cache): the next Flush says so, once; a session that
// ends with all its writes flushed costs nothing.
func TestLinkFlushAfterLostWrites(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	b, links, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)

	_, err = b.WriteAt(make([]byte, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, b.Flush())
	links.drop()
	require.NoError(t, b.Flush(), "every write was flushed before the session ended")

	_, err = b.WriteAt(make([]byte, 4096), 4096)
	require.NoError(t, err)
	links.drop()
	err = b.Flush()
	require.ErrorContains(t, err, "1 session(s) ended with acknowledged writes not yet flushed")
	require.True(t, backend.IsRetryable(err))
	require.NoError(t, b.Flush(), "the loss is told once: the caller has written its data again")

	// The same from a flush that the session's end cuts short.
	_, err = b.WriteAt(make([]byte, 4096), 8192)
	require.NoError(t, err)
	onCommand(lun, scsiSyncCache16, func() bool { links.drop(); return false })
	require.ErrorContains(t, b.Flush(), "not yet flushed")
}

// A FUA write on a LUN without the FUA bit is a write and a SYNCHRONIZE CACHE: if the session ends
// between the two, the write may be lost whatever the second command says, and the FUA write fails.
func TestLinkEmulatedFUAAcrossSessions(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	b, links, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)
	require.False(t, b.li.fua)
	onCommand(lun, scsiSyncCache16, func() bool { links.drop(); return false })
	_, err = b.WriteAtFUA(bytes.Repeat([]byte{9}, 4096), 0)
	require.ErrorContains(t, err, "not yet flushed")
	_, err = b.WriteAtFUA(bytes.Repeat([]byte{9}, 4096), 0)
	require.NoError(t, err, "written again on the new session")
}

// While the target is away commands wait, up to reconnect-wait, then fail with a retryable error;
// once it is back they run. Close ends the wait at once.
func TestLinkTargetAway(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	b, links, err := openFakeLink(t, lun, 300*time.Millisecond)
	require.NoError(t, err)
	links.setRefuse(true)
	links.drop()

	start := time.Now()
	_, err = b.ReadAt(make([]byte, 512), 0)
	require.ErrorIs(t, err, errTargetGone)
	require.ErrorContains(t, err, "target unreachable for 300ms (reconnect-wait)")
	require.ErrorContains(t, err, "connection refused", "why the last login failed")
	require.True(t, backend.IsRetryable(err))
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	links.setRefuse(false)
	require.Eventually(t, func() bool {
		_, err := b.ReadAt(make([]byte, 512), 0)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "back once the target is")

	links.setRefuse(true)
	links.drop()
	done := make(chan error, 1)
	go func() {
		_, err := b.ReadAt(make([]byte, 512), 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, b.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, backend.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close left a command waiting for the target")
	}
}

// A LUN that comes back with another size is not the disk that was opened: it is not used.
func TestLinkLUNChanged(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	b, links, err := openFakeLink(t, lun, 500*time.Millisecond)
	require.NoError(t, err)
	lun.mu.Lock()
	lun.disk = make([]byte, 2<<20)
	lun.mu.Unlock()
	links.drop()
	_, err = b.ReadAt(make([]byte, 512), 0)
	require.True(t, errors.Is(err, errTargetGone), "%v", err)
	require.ErrorContains(t, err, "is now 4096 blocks of 512 bytes, not 2048 of 512 as when opened")
}
