//go:build !linux

package process

import (
	"errors"
	"fmt"
)

// SetIOFlusher is Linux's alone.
func SetIOFlusher() error { return fmt.Errorf("PR_SET_IO_FLUSHER: %w", errors.ErrUnsupported) }

// LockMemory is Linux's alone here.
func LockMemory() error { return fmt.Errorf("lock memory: %w", errors.ErrUnsupported) }

// binaryShmem is 0: the binary's pages are counted apart on Linux alone.
func binaryShmem() (uint64, error) { return 0, nil }
