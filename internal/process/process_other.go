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
