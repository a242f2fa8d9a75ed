package trace

import (
	"bufio"
	"fmt"
	"io"
)

// readRecord returns the next size-byte record of a binary trace, in place in the buffer (valid
// until the next read) and without allocating; io.EOF at a record boundary, ErrTruncated (with
// how many bytes the last record had) inside one.
func readRecord(br *bufio.Reader, size int) ([]byte, error) {
	b, err := br.Peek(size)
	if len(b) == size {
		_, _ = br.Discard(size) // cannot fail: the bytes are buffered
		return b, nil
	}
	if err == io.EOF {
		if len(b) == 0 {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("%w (%d of %d bytes)", ErrTruncated, len(b), size)
	}
	return nil, err
}
