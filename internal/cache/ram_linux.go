package cache

import "golang.org/x/sys/unix"

// totalRAM is the machine's RAM in bytes, 0 where it cannot be read.
func totalRAM() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return si.Totalram * uint64(si.Unit)
}
