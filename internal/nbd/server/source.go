package server

import "io"

// source is a reader whose underlying reader can change under a bufio.Reader, and which can be
// handed back bytes read past br, to give them out again first.
type source struct {
	r       io.Reader
	unread  []byte // given back, not yet read again
	storage []byte // unread's memory, kept for the next time
}

func (s *source) Read(p []byte) (int, error) {
	if len(s.unread) > 0 {
		n := copy(p, s.unread)
		s.unread = s.unread[n:]
		return n, nil
	}
	return s.r.Read(p)
}

// giveBack makes p the next bytes read. Nothing may be unread already.
func (s *source) giveBack(p []byte) {
	s.storage = append(s.storage[:0], p...)
	s.unread = s.storage
}
