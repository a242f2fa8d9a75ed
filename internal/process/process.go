// Package process is what the daemon asks of the kernel about itself while it serves block
// devices, and what it reads of its own memory: the I/O flusher flag on every thread, a lower OOM
// score, locked memory, and the resident set by kind.
//
// A daemon that serves a block device to the kernel it runs on must never wait on that device's
// own dirty pages or recurse into it from memory reclaim: the device would wait on the daemon and
// the daemon on the device. PR_SET_IO_FLUSHER is the kernel's answer (ublksrv sets it on its queue
// threads). This package must never raise a setting the user lowered (an OOM score set lower by
// the unit stays), and never fail silently: every call says what it did or why it could not.
package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
)

// Thread flags (include/linux/sched.h) that PR_SET_IO_FLUSHER sets.
const (
	pfMemallocNoIO   = 0x00080000
	pfLocalThrottle  = 0x00100000
	ioFlusherFlags   = pfMemallocNoIO | pfLocalThrottle
	procTaskStatFlag = 9 // the flags' field of /proc/PID/task/TID/stat, counting from 1
)

// ThreadsWithoutIOFlusher lists the threads of the process (by thread ID) whose flags lack the
// I/O flusher's: none once SetIOFlusher succeeded, however many threads were created since.
func ThreadsWithoutIOFlusher() ([]int, error) {
	dir := "/proc/self/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var without []int
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "stat"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited
		}
		if err != nil {
			return nil, err
		}
		flags, err := statFlags(b)
		if err != nil {
			return nil, fmt.Errorf("thread %s: %w", t.Name(), err)
		}
		if flags&ioFlusherFlags != ioFlusherFlags {
			tid, _ := strconv.Atoi(t.Name())
			without = append(without, tid)
		}
	}
	return without, nil
}

// statFlags reads the flags field of a /proc stat line. The command name, in parentheses, may
// hold spaces and parentheses, so the fields are counted from the last ')'.
func statFlags(stat []byte) (uint64, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	fields := strings.Fields(string(stat[end+1:]))
	// fields[0] is field 3 (state).
	if i := procTaskStatFlag - 3; i < len(fields) {
		return strconv.ParseUint(fields[i], 10, 64)
	}
	return 0, errors.New("stat: too few fields")
}

// OOMScoreFile is where LowerOOMScore reads and writes; a variable for tests.
var OOMScoreFile = "/proc/self/oom_score_adj"

// LowerOOMScore sets the process's oom_score_adj to to, unless it is already that low or lower
// (a unit's OOMScoreAdjust stays), and returns the value it found. Lowering it needs
// CAP_SYS_RESOURCE.
func LowerOOMScore(to int) (from int, err error) {
	b, err := os.ReadFile(OOMScoreFile)
	if err != nil {
		return 0, err
	}
	if from, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return 0, fmt.Errorf("%s: %w", OOMScoreFile, err)
	}
	if from <= to {
		return from, nil
	}
	if err := os.WriteFile(OOMScoreFile, []byte(strconv.Itoa(to)), 0); err != nil {
		return from, fmt.Errorf("lower the OOM score: %w (it needs root or CAP_SYS_RESOURCE)", err)
	}
	return from, nil
}

// Memory is the process's memory as the kernel and the Go runtime count it, in bytes.
type Memory struct {
	RSS   uint64 `json:"rss_bytes"`       // resident now (VmRSS)
	Peak  uint64 `json:"rss_peak_bytes"`  // the most resident at once since the start (VmHWM)
	Anon  uint64 `json:"rss_anon_bytes"`  // of RSS: anonymous memory (Go's heap, mmapped buffers)
	File  uint64 `json:"rss_file_bytes"`  // of RSS: pages of mapped files (the binary, the metadata store's tables)
	Shmem uint64 `json:"rss_shmem_bytes"` // of RSS: shared memory (files on a tmpfs it maps)
	// Binary is, of Shmem, the pages of the process's own binary where that lies on a tmpfs (an
	// initramfs, a live system): the file system holds them whether the process runs or not.
	Binary   uint64 `json:"rss_binary_shmem_bytes"`
	Held     uint64 `json:"held_bytes"`     // Anon + Shmem - Binary: what the kernel cannot reclaim from it
	Locked   uint64 `json:"locked_bytes"`   // locked in RAM (VmLck)
	GoHeap   uint64 `json:"go_heap_bytes"`  // Go's heap in use: live and not yet collected objects
	GoFree   uint64 `json:"go_free_bytes"`  // Go's heap free but not yet returned to the kernel
	GoOther  uint64 `json:"go_other_bytes"` // Go's runtime besides its heap: stacks, metadata
	GoLimit  uint64 `json:"go_limit_bytes"` // the Go runtime's memory limit (SetMemoryLimit); 0 when none
	GoCycles uint64 `json:"go_gc_cycles"`   // garbage collections so far
}

// ReadMemory reads /proc/self/status and the Go runtime's metrics (and /proc/self/smaps, where
// the binary lies on a tmpfs).
func ReadMemory() (Memory, error) {
	var m Memory
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return m, err
	}
	defer f.Close()
	fields := map[string]*uint64{"VmRSS:": &m.RSS, "VmHWM:": &m.Peak, "RssAnon:": &m.Anon,
		"RssFile:": &m.File, "RssShmem:": &m.Shmem, "VmLck:": &m.Locked}
	s := bufio.NewScanner(f)
	for s.Scan() {
		w := strings.Fields(s.Text())
		if p, ok := fields[w[0]]; ok && len(w) == 3 && w[2] == "kB" {
			kb, err := strconv.ParseUint(w[1], 10, 64)
			if err != nil {
				return m, fmt.Errorf("/proc/self/status: %s: %w", w[0], err)
			}
			*p = kb << 10
		}
	}
	if err := s.Err(); err != nil {
		return m, err
	}
	if m.Binary, err = binaryShmem(); err != nil {
		return m, err
	}
	m.Held = m.Anon + m.Shmem - min(m.Binary, m.Shmem)
	samples := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/gomemlimit:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	metrics.Read(samples)
	v := make([]uint64, len(samples))
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	m.GoHeap = v[1] + v[2]
	m.GoFree = v[3]
	m.GoOther = v[0] - v[1] - v[2] - v[3] - v[4]
	if v[5] < 1<<62 { // math.MaxInt64: no limit
		m.GoLimit = v[5]
	}
	m.GoCycles = v[6]
	return m, nil
}

// smapsFileShmem sums, over the mappings in smaps (the text of a /proc/PID/smaps) of the file on
// device major:minor with inode ino, their resident pages less the anonymous ones (a private
// mapping's copied pages): the file's own pages.
func smapsFileShmem(smaps io.Reader, major, minor uint32, ino uint64) (uint64, error) {
	var sum, rss uint64
	in := false
	s := bufio.NewScanner(smaps)
	for s.Scan() {
		w := strings.Fields(s.Text())
		if len(w) == 0 {
			continue
		}
		if !strings.HasSuffix(w[0], ":") { // a mapping's first line: range perms offset dev inode [path]
			if len(w) < 5 {
				return 0, fmt.Errorf("smaps: a mapping's line of %d fields", len(w))
			}
			mj, mn, ok := strings.Cut(w[3], ":")
			a, err1 := strconv.ParseUint(mj, 16, 32)
			b, err2 := strconv.ParseUint(mn, 16, 32)
			i, err3 := strconv.ParseUint(w[4], 10, 64)
			if !ok || err1 != nil || err2 != nil || err3 != nil {
				return 0, fmt.Errorf("smaps: a mapping's device %q and inode %q", w[3], w[4])
			}
			in = uint32(a) == major && uint32(b) == minor && i == ino
			continue
		}
		if !in || len(w) != 3 || w[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseUint(w[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("smaps: %s: %w", w[0], err)
		}
		switch w[0] {
		case "Rss:":
			rss = kb << 10
			sum += rss
		case "Anonymous:":
			sum -= min(kb<<10, rss)
		}
	}
	return sum, s.Err()
}
