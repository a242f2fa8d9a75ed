// Package cli holds tierblk's cobra commands, one file each. Every command's RunE only parses flags
// and calls a plain runX(ctx, opts) function that tests call without cobra. It must never call
// os.Exit: exit codes are decided by ExitCode in main.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/config"
)

// UsageError is a mistake in the command line or configuration; main exits with status 2 for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usageErrorf(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// ExitCode maps a command's error onto the process exit status: 0 for success, 2 for usage errors,
// 1 for everything else.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	default:
		return 1
	}
}

// NewRoot builds the tierblk command tree. version is printed by `tierblk version`.
func NewRoot(version string) *cobra.Command {
	root := &cobra.Command{
		Use:   "tierblk",
		Short: "A block device over NBD with a tiered cache in front of slow storage",
		Long: `tierblk exports a block device over NBD (and ublk) and puts a tiered cache
(RAM, then SSD, then the backing store) in front of slow storage.

Quick start:
  tierblk serve --backend 'file:///srv/disk.img?size=8GiB' --nbd unix:/run/tierblk.sock
  nbdinfo 'nbd+unix:///?socket=/run/tierblk.sock'`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noSuchCommand("unknown command %q; see 'tierblk --help'"),
		RunE:          showHelp,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &UsageError{Err: fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	root.AddCommand(newSimCmd(), newVersionCmd(version))
	root.AddCommand(platformCommands(version)...)
	root.AddCommand(newStatsCmd(), newFlushCmd(), newModeCmd(), newHealCmd(), newScrubCmd(), newISCSILsCmd())
	return root
}

// noSuchCommand makes a command with subcommands treat a stray argument as a usage error: cobra
// otherwise reports an unknown command as a plain error (exit 1). format takes the argument.
func noSuchCommand(format string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageErrorf(format, args[0])
		}
		return nil
	}
}

// showHelp is the action of a command that only groups subcommands.
func showHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }

// newLogger writes text logs at level to w.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	l, err := config.ParseLogLevel(level)
	if err != nil {
		return nil, usageErrorf("--log-level: %v", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
