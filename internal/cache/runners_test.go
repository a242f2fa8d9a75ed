package cache

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// goroutineID is the number runtime.Stack gives the calling goroutine.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// TestRunners: each task runs once; a task after another has ended runs on that one's goroutine
// (no new goroutine, no stack to grow again); at most runnersIdle goroutines wait; after close they
// end and tasks still run, each on a goroutine of its own.
func TestRunners(t *testing.T) {
	f := newRunners()
	ids := make(chan string, 1)
	f.run(func() { ids <- goroutineID() })
	first := <-ids
	require.Eventually(t, func() bool { return f.idle.Load() == 1 }, time.Minute, time.Millisecond, "the goroutine waits for more")
	f.run(func() { ids <- goroutineID() })
	require.Equal(t, first, <-ids, "the second task runs on the first one's goroutine")

	// More tasks at once than may wait: all run, and runnersIdle goroutines stay.
	require.Eventually(t, func() bool { return f.idle.Load() == 1 }, time.Minute, time.Millisecond)
	gate := make(chan struct{})
	var ran sync.WaitGroup
	var count atomic.Int32
	for range runnersIdle + 8 {
		ran.Add(1)
		f.run(func() { <-gate; count.Add(1); ran.Done() })
	}
	close(gate)
	ran.Wait()
	require.EqualValues(t, runnersIdle+8, count.Load())
	require.Eventually(t, func() bool { return f.idle.Load() == runnersIdle }, time.Minute, time.Millisecond)

	f.close()
	require.Eventually(t, func() bool { return f.idle.Load() == 0 }, time.Minute, time.Millisecond, "closed: none waits")
	done := make(chan struct{})
	f.run(func() { close(done) })
	<-done
	f.close() // twice: no panic
}
