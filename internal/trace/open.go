package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// bufSize is the read buffer of every reader: large, so a text line or a binary record is almost
// always parsed in place, and the bound on a text line's length.
const bufSize = 256 << 10

// detectSize is how much of the (decompressed) start of a file auto-detection looks at.
const detectSize = 64 << 10

// Formats lists the values Open accepts for its format argument, for help texts.
func Formats() []string {
	return []string{"auto", "vscsi", "oraclegeneral", "arc", "msr", "blkparse", "fio", "csv:SPEC"}
}

// Open opens a trace file, decompressing gzip, zstd and xz files (told by their magic bytes, not
// their names), and returns a reader for format: one of Formats, case-insensitive. "auto" tells
// the format from the content, with the file's extension as a hint.
func Open(path, format string) (Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var size int64
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		size = fi.Size()
	}
	r, err := newReader(f, path, format, f, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// NewReader is Open for a stream: name is only used in error messages and as the extension hint
// of "auto". Closing the returned reader does not close r, but waits for a read of r in progress
// (r is read ahead of the decoder, in a goroutine of its own).
func NewReader(r io.Reader, name, format string) (Reader, error) {
	return newReader(r, name, format, nil, 0)
}

func newReader(r io.Reader, name, format string, file io.Closer, size int64) (Reader, error) {
	in, err := openInput(r, name, file, size)
	if err != nil {
		return nil, err
	}
	format = strings.TrimSpace(format)
	if strings.EqualFold(format, "auto") || format == "" {
		head, err := in.br.Peek(detectSize)
		if err != nil && err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
			in.Close()
			return nil, &Error{File: name, Err: err}
		}
		format, err = detect(head, name)
		if err != nil {
			in.Close()
			return nil, &Error{File: name, Err: err}
		}
	}
	rd, err := newFormatReader(in, format)
	if err != nil {
		in.Close()
		return nil, err
	}
	return rd, nil
}

func newFormatReader(in *input, format string) (Reader, error) {
	name, arg, hasArg := strings.Cut(format, ":")
	name = strings.ToLower(name)
	if hasArg && name != "csv" && name != "blkparse" {
		return nil, &Error{File: in.name, Err: fmt.Errorf("format %q takes no argument; formats: %s", format, strings.Join(Formats(), ", "))}
	}
	switch name {
	case "vscsi":
		return newVscsiReader(in)
	case "oraclegeneral":
		return &oracleGeneralReader{in: in}, nil
	case "arc":
		return &textReader{in: in, format: "arc", p: arcParser{}}, nil
	case "msr":
		p := newMSRParser()
		return volumeTextReader{&textReader{in: in, format: "msr", p: p}, p.vols}, nil
	case "blkparse":
		p, err := newBlkparseParser(arg)
		if err != nil {
			return nil, &Error{File: in.name, Format: "blkparse", Err: err}
		}
		return volumeTextReader{&textReader{in: in, format: "blkparse", p: p}, p.vols}, nil
	case "fio":
		p := newFioParser()
		return volumeTextReader{&textReader{in: in, format: "fio", p: p}, p.vols}, nil
	case "csv":
		p, err := newCSVParser(arg)
		if err != nil {
			return nil, &Error{File: in.name, Format: "csv", Err: err}
		}
		t := &textReader{in: in, format: "csv", p: p}
		if p.vols != nil {
			return volumeTextReader{t, p.vols}, nil
		}
		return t, nil
	}
	return nil, &Error{File: in.name, Err: fmt.Errorf("unknown format %q; formats: %s", format, strings.Join(Formats(), ", "))}
}

// input is a trace's byte stream after decompression.
type input struct {
	name    string
	br      *bufio.Reader
	closers []func() error
	read    atomic.Int64 // bytes read from the source, as stored
	size    int64        // the source's size; 0 if unknown
}

func (in *input) Close() error {
	var errs []error
	for i := len(in.closers) - 1; i >= 0; i-- {
		errs = append(errs, in.closers[i]())
	}
	in.closers = nil
	return errors.Join(errs...)
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
	xzMagic   = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
)

// openInput wraps r in a decompressor when its first bytes are a gzip, zstd or xz magic number.
// The source is read in large chunks by a goroutine of its own, and a decompressor runs in
// another, so that reading, decompressing and decoding records overlap.
func openInput(r io.Reader, name string, file io.Closer, size int64) (*input, error) {
	in := &input{name: name, size: size}
	if file != nil {
		in.closers = append(in.closers, file.Close)
	}
	src := newReadAhead(counter{r, &in.read})
	in.closers = append(in.closers, src.Close)
	br := bufio.NewReaderSize(src, bufSize)
	magic, err := br.Peek(len(xzMagic))
	if err != nil && err != io.EOF {
		in.Close()
		return nil, &Error{File: name, Err: err}
	}
	var dec io.Reader
	kind := ""
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		z, err := gzip.NewReader(br)
		if err != nil {
			in.Close()
			return nil, &Error{File: name, Format: "gzip", Err: err}
		}
		// Close repeats the stream's read error, which Next has reported already.
		in.closers = append(in.closers, func() error { _ = z.Close(); return nil })
		dec, kind = z, "gzip"
	case bytes.HasPrefix(magic, zstdMagic):
		z, err := zstd.NewReader(br)
		if err != nil {
			in.Close()
			return nil, &Error{File: name, Format: "zstd", Err: err}
		}
		in.closers = append(in.closers, func() error { z.Close(); return nil })
		dec, kind = z, "zstd"
	case bytes.HasPrefix(magic, xzMagic):
		z, err := xz.NewReader(br)
		if err != nil {
			in.Close()
			return nil, &Error{File: name, Format: "xz", Err: err}
		}
		dec, kind = z, "xz"
	default:
		in.br = br
		return in, nil
	}
	out := newReadAhead(decompressed{dec, kind})
	in.closers = append(in.closers, out.Close)
	in.br = bufio.NewReaderSize(out, bufSize)
	return in, nil
}

// decompressed names the compression in the errors of a decompressor, whose bare
// "unexpected EOF" would otherwise read like a truncated record.
type decompressed struct {
	r    io.Reader
	kind string
}

func (d decompressed) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%s stream: %w (truncated or corrupt compressed file)", d.kind, err)
	}
	return n, err
}

// extHint is the file's format extension, lower case, without a compression suffix
// ("x.oracleGeneral.zst" gives ".oraclegeneral").
func extHint(name string) string {
	base := strings.ToLower(filepath.Base(name))
	for _, c := range []string{".gz", ".zst", ".zstd", ".xz"} {
		base = strings.TrimSuffix(base, c)
	}
	if strings.HasSuffix(base, ".bin") && strings.Contains(base, ".oraclegeneral") {
		return ".oraclegeneral"
	}
	return filepath.Ext(base)
}

// detect tells a trace's format from its first bytes (head), using the name's extension where
// the content alone cannot decide (oracleGeneral records have no magic number).
func detect(head []byte, name string) (string, error) {
	ext := extHint(name)
	switch {
	case len(head) == 0:
		return "", errors.New("empty file: cannot tell its format")
	case bytes.HasPrefix(head, []byte(fioV2Header)), bytes.HasPrefix(head, []byte(fioV3Header)):
		return "fio", nil
	case looksVscsi(head):
		return "vscsi", nil
	}
	if isText(head) {
		sample := sampleLines(head)
		switch {
		case parsesAll(newMSRParser(), sample):
			return "msr", nil
		case parsesAll(mustBlkparse(), sample):
			return "blkparse", nil
		case parsesAll(arcParser{}, sample):
			return "arc", nil
		}
	} else if looksOracleGeneral(head, ext == ".oraclegeneral") {
		return "oraclegeneral", nil
	}
	hint := ""
	if ext == ".csv" || ext == ".txt" {
		hint = " (for a CSV with other columns, describe them: --format csv:SPEC)"
	}
	return "", fmt.Errorf("cannot tell the format from the content; give one of: %s%s",
		strings.Join(Formats()[1:], ", "), hint)
}

// isText reports whether head is printable ASCII text with line breaks.
func isText(head []byte) bool {
	for _, c := range head {
		if (c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}

// sampleLines returns up to 256 complete non-blank lines of head (the last, possibly cut, line of
// a full buffer is left out).
func sampleLines(head []byte) [][]byte {
	if len(head) >= detectSize {
		if i := bytes.LastIndexByte(head, '\n'); i >= 0 {
			head = head[:i]
		}
	}
	var out [][]byte
	for len(head) > 0 && len(out) < 256 {
		line := head
		if i := bytes.IndexByte(head, '\n'); i >= 0 {
			line, head = head[:i], head[i+1:]
		} else {
			head = nil
		}
		if line = trimEOL(line); !isBlank(line) {
			out = append(out, line)
		}
	}
	return out
}

// parsesAll reports whether p accepts every sampled line and finds a request in one of them.
func parsesAll(p lineParser, lines [][]byte) bool {
	found := false
	for _, l := range lines {
		var r Request
		ok, err := p.parseLine(l, &r)
		if err != nil {
			return false
		}
		found = found || ok
	}
	return found
}
