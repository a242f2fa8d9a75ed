package trace

import (
	"io"
	"sync/atomic"
)

// readAheadChunk is the size of one read from a trace's source: large, so that a file is read in
// few system calls and a decompressor works on long runs.
const readAheadChunk = 1 << 20

// readAheadChunks is how many chunks may be read ahead of the decoder; it bounds the memory.
const readAheadChunks = 4

// readAhead reads its source in a goroutine of its own, up to readAheadChunks chunks ahead of its
// reader, so that reading the file (or decompressing it) runs beside the decoding of records.
// Close stops the goroutine and waits for it: it must not be called while a Read of the source
// can block forever.
type readAhead struct {
	full chan chunk
	free chan []byte
	stop chan struct{}
	done chan struct{}
	buf  []byte // the chunk being read, to recycle
	cur  []byte // its unread part
	err  error
}

type chunk struct {
	b   []byte
	err error
}

func newReadAhead(src io.Reader) *readAhead {
	ra := &readAhead{
		full: make(chan chunk, readAheadChunks),
		free: make(chan []byte, readAheadChunks),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go ra.fill(src)
	return ra
}

func (ra *readAhead) fill(src io.Reader) {
	defer close(ra.done)
	made := 0
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.stop:
			return
		default:
			if made < readAheadChunks {
				buf, made = make([]byte, readAheadChunk), made+1
				break
			}
			select {
			case buf = <-ra.free:
			case <-ra.stop:
				return
			}
		}
		n, err := io.ReadFull(src, buf)
		if err == io.ErrUnexpectedEOF { // a short last chunk; a decompressor's own errors are wrapped
			err = io.EOF
		}
		select {
		case ra.full <- chunk{buf[:n], err}:
		case <-ra.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.err != nil {
			return 0, ra.err
		}
		if ra.buf != nil {
			ra.free <- ra.buf[:cap(ra.buf)] // never blocks: free holds every chunk
			ra.buf = nil
		}
		c := <-ra.full
		ra.buf, ra.cur, ra.err = c.b, c.b, c.err
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

func (ra *readAhead) Close() error {
	close(ra.stop)
	<-ra.done
	return nil
}

// counter counts the bytes read from a trace's source, for Position; the read-ahead goroutine
// writes it while the decoder's caller reads it.
type counter struct {
	r io.Reader
	n *atomic.Int64
}

func (c counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Positioner is implemented by every reader this package returns: Position reports how many bytes
// of the source (the file as stored, compressed or not) have been read, and its size (0 when
// unknown, as for a stream), so a caller can show progress and estimate the time left.
type Positioner interface {
	Position() (read, size int64)
}

func (in *input) position() (int64, int64) { return in.read.Load(), in.size }

// Position implements Positioner.
func (r *oracleGeneralReader) Position() (int64, int64) { return r.in.position() }

// Position implements Positioner.
func (r *vscsiReader) Position() (int64, int64) { return r.in.position() }

// Position implements Positioner.
func (t *textReader) Position() (int64, int64) { return t.in.position() }
