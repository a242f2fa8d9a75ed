package process

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SetIOFlusher marks every thread of the process PR_SET_IO_FLUSHER: the kernel then throttles
// their buffered writes only against the device each writes to, not against the dirty pages of
// the whole machine (which may be those of the device the daemon serves), and their allocations
// never start I/O to reclaim memory. The kernel copies the flag to every thread created after it
// (clone keeps the task's flags), which is how the Go runtime's later threads get it; the test of
// this package reads every thread's flags back. It needs CAP_SYS_RESOURCE.
//
// It fails with ENOTSUP in a binary built with cgo, where the runtime cannot reach every thread;
// tierblk's releases are built without it.
func SetIOFlusher() error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_IO_FLUSHER, 1, 0); e != 0 {
		switch e {
		case syscall.EPERM:
			return fmt.Errorf("PR_SET_IO_FLUSHER: %w (it needs CAP_SYS_RESOURCE: root, outside a container or in a privileged one)", e)
		case syscall.ENOTSUP:
			return fmt.Errorf("PR_SET_IO_FLUSHER: %w (a binary built with cgo, whose threads Go cannot all reach: "+
				"build it with CGO_ENABLED=0, as make build does)", e)
		}
		return fmt.Errorf("PR_SET_IO_FLUSHER: %w", e)
	}
	return nil
}

// LockMemory locks the process's pages in RAM, those it has and those it will fault in, so that
// serving a swap device or the root file system never waits on a page swapped out to it. Pages
// are locked as they are touched (MCL_ONFAULT), not all the address space the runtime reserves.
func LockMemory() error {
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE | unix.MCL_ONFAULT); err != nil {
		return fmt.Errorf("lock memory (mlockall): %w (it needs root, CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK, e.g. LimitMEMLOCK=infinity in a unit)", err)
	}
	return nil
}

// exeOnTmpfs is the device and inode of the process's binary where that lies on a tmpfs, whose
// pages a mapping counts as shared memory; nil elsewhere (a disk's pages are file pages, which
// the kernel reclaims).
var exeOnTmpfs = sync.OnceValue(func() *unix.Stat_t {
	var fs unix.Statfs_t
	if unix.Statfs("/proc/self/exe", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return nil
	}
	var st unix.Stat_t
	if unix.Stat("/proc/self/exe", &st) != nil {
		return nil
	}
	return &st
})

// binaryEvery is how often binaryShmem reads /proc/self/smaps again. A read walks the page tables
// of every mapping, which the daemon's memory watch paid at each of its samples (bench kernel
// --profile: a few per cent of the guest's CPU, whose binary lies on a tmpfs), while the binary's
// pages change only as more of its code first runs.
const binaryEvery = 10 * time.Second

// binaryLast is binaryShmem's last reading and when it was taken.
var binaryLast struct {
	sync.Mutex
	at    time.Time
	bytes uint64
}

// binaryShmem is, of the process's shared memory, the pages of its binary: 0 unless that lies on
// a tmpfs. It reads them at most every binaryEvery.
func binaryShmem() (uint64, error) {
	st := exeOnTmpfs()
	if st == nil {
		return 0, nil
	}
	binaryLast.Lock()
	defer binaryLast.Unlock()
	if !binaryLast.at.IsZero() && time.Since(binaryLast.at) < binaryEvery {
		return binaryLast.bytes, nil
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := smapsFileShmem(f, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	if err == nil {
		binaryLast.at, binaryLast.bytes = time.Now(), n
	}
	return n, err
}
