package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/trace"
)

// ReplayDepth is how many requests a replay keeps in flight, as fio's rows do with --iodepth=32.
const ReplayDepth = 32

// replayPattern is the byte every replayed write carries: not zero, so that no layer can take a
// write for a hole.
const replayPattern = 0xa5

// Replay is a block trace loaded for replaying: its reads and writes in trace order. Loading it
// once, before any replay, keeps decompressing and parsing out of the measured time and off the
// CPUs the servers use during it.
type Replay struct {
	// Name is the trace file's name without a compression suffix.
	Name string
	reqs []replayReq
	// Skipped counts the trace's requests that are not replayed: of length 0, or neither a read
	// nor a write (trims, flushes, other SCSI commands).
	Skipped int
}

// replayReq is one request to replay: 16 bytes, so that the 914,145 requests of the OLTP trace take
// 15 MB.
type replayReq struct {
	off    int64
	length uint32
	write  bool
}

// ReplayStats is what a replay issued and how long it took.
type ReplayStats struct {
	Reads, Writes           int64
	ReadBytes, WrittenBytes int64
	Elapsed                 time.Duration
}

// LoadReplay reads the trace at path (any format and compression trace.Open takes). A request's
// range is kept as the trace has it; Run fits it into the export. The volumes of a trace of
// several disks are replayed onto the one export, as the trace numbers their offsets.
func LoadReplay(path string) (*Replay, error) {
	r, err := trace.Open(path, "auto")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	name := filepath.Base(path)
	for _, ext := range []string{".gz", ".zst", ".zstd", ".xz"} {
		name = strings.TrimSuffix(name, ext)
	}
	rp := &Replay{Name: name}
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		// A request longer than 4 GiB is no block trace's, and the length must fit the record.
		if q.Length <= 0 || q.Length > 1<<32-1 || (q.Op != trace.OpRead && q.Op != trace.OpWrite) {
			rp.Skipped++
			continue
		}
		rp.reqs = append(rp.reqs, replayReq{off: q.Offset, length: uint32(q.Length), write: q.Op == trace.OpWrite})
	}
	if len(rp.reqs) == 0 {
		return nil, fmt.Errorf("trace %s has no reads or writes to replay", path)
	}
	return rp, nil
}

// Requests is how many requests a replay issues.
func (rp *Replay) Requests() int { return len(rp.reqs) }

// fit places a request inside an export of size bytes: a request longer than the export is cut to
// it, and one that reaches past the end wraps around (its offset modulo the room left), so that a
// trace of a larger disk keeps its spread of offsets instead of piling up at the end.
func fit(q replayReq, size int64) (off, length int64) {
	length = min(int64(q.length), size)
	off = q.off
	if room := size - length; off > room {
		off %= room + 1
	}
	return off, length
}

// Run replays the trace through c in trace order with up to depth requests in flight: reads as
// reads, writes as writes of a fixed pattern. It returns at the first failed request, after those
// in flight completed.
func (rp *Replay) Run(ctx context.Context, c *client.Client, depth int) (ReplayStats, error) {
	if depth < 1 {
		return ReplayStats{}, fmt.Errorf("replay depth %d: give at least 1", depth)
	}
	size := c.Size()
	if size <= 0 {
		return ReplayStats{}, errors.New("the export is empty")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Workers take the requests in trace order from one channel: at most depth are in flight, and
	// a request is issued only when every request before it was.
	next := make(chan replayReq)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		total    ReplayStats
	)
	began := time.Now()
	for range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st ReplayStats
			var rbuf, wbuf []byte
			for q := range next {
				off, n := fit(q, size)
				var err error
				if q.write {
					if int64(len(wbuf)) < n {
						wbuf = make([]byte, n)
						for i := range wbuf {
							wbuf[i] = replayPattern
						}
					}
					_, err = c.WriteAt(wbuf[:n], off)
					st.Writes++
					st.WrittenBytes += n
				} else {
					if int64(len(rbuf)) < n {
						rbuf = make([]byte, n)
					}
					_, err = c.ReadAt(rbuf[:n], off)
					st.Reads++
					st.ReadBytes += n
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("replaying %s: %w", rp.Name, err)
					}
					mu.Unlock()
					cancel()
				}
			}
			mu.Lock()
			total.Reads += st.Reads
			total.Writes += st.Writes
			total.ReadBytes += st.ReadBytes
			total.WrittenBytes += st.WrittenBytes
			mu.Unlock()
		}()
	}
feed:
	for _, q := range rp.reqs {
		select {
		case next <- q:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	total.Elapsed = time.Since(began)
	if firstErr != nil {
		return total, firstErr
	}
	return total, ctx.Err()
}
