package cache

import (
	"sync"
	"time"
)

// background owns the cache's long-lived goroutines, the SSD tier's checkpoint loop and the
// destager: it starts them, stops them all through one channel, and waits for them, so that Close
// asks it and reaches into neither.
type background struct {
	// grace is how long halt waits for the loops to finish what they are doing.
	grace    time.Duration
	stop     chan struct{}
	stopOnce sync.Once
	running  sync.WaitGroup
}

// closeGrace is the background's grace unless a test shortens it.
const closeGrace = 5 * time.Second

func newBackground() *background {
	return &background{grace: closeGrace, stop: make(chan struct{})}
}

// run starts loop, which must return once stop is closed.
func (b *background) run(loop func(stop <-chan struct{})) {
	b.running.Go(func() { loop(b.stop) })
}

// halt tells the loops to stop and waits up to grace for them; false if one is still running
// (waiting on a backend that does not answer): the caller then fails what it waits on, and waits.
func (b *background) halt() bool {
	b.stopOnce.Do(func() { close(b.stop) })
	ended := make(chan struct{})
	go func() {
		b.running.Wait()
		close(ended)
	}()
	return !sleepOrStop(ended, b.grace)
}

// wait waits for the loops after halt.
func (b *background) wait() { b.running.Wait() }

// tickOrKick waits for the next tick or kick, and reports false once stop closes: how the
// background loops wait between their rounds.
func tickOrKick(stop <-chan struct{}, tick <-chan time.Time, kick <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	case <-tick:
	case <-kick:
	}
	return true
}

// sleepOrStop waits d, or until stop closes; it reports whether d passed.
func sleepOrStop(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}
