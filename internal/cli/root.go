// Package cli holds tierblk's cobra commands, one file each. Every command's RunE only parses flags
// and calls a plain runX(ctx, opts) function that tests call without cobra. It must never call
// os.Exit: exit codes are decided by ExitCode in main.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

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

// NewRoot builds the tierblk command tree. version is printed by `tierblk version` and
// `tierblk --version`.
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
		Args:          noSuchCommand("unknown command %q for \"tierblk\"%s (see 'tierblk --help')"),
		RunE:          showHelp,
		// What cobra's own suggestions use; SuggestionsFor (noSuchCommand) takes it as it is.
		SuggestionsMinimumDistance: 2,
		// cobra's --version (and -v) prints this through the template below: the same line as
		// `tierblk version`.
		Version: versionLine(version),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		// A command with subcommands (the root, bench) runs itself with its arguments when the
		// first is no subcommand, so cobra parses its flags before its Args sees that word: in
		// `tierblk statss --admin x` the flag would be the error reported. The words read before
		// the bad flag are kept: the first of them is the mistake to report.
		if c.HasSubCommands() && c.Args != nil {
			if argErr := c.Args(c, c.Flags().Args()); argErr != nil {
				return argErr
			}
		}
		return &UsageError{Err: fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		// cobra's own finds the root for a word that names no command (the root takes
		// arguments) and prints its help: a mistyped topic is a usage error, as the command is.
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err == nil && len(rest) > 0 && target.Args != nil {
				err = target.Args(target, rest)
			}
			if err != nil {
				return err
			}
			return target.Help()
		},
	})
	root.AddCommand(newSimCmd(), newVersionCmd(version))
	root.AddCommand(platformCommands(version)...)
	root.AddCommand(newStatsCmd(), newMRCCmd(), newFlushCmd(), newModeCmd(), newHealCmd(), newScrubCmd(), newISCSILsCmd())
	return root
}

// noSuchCommand makes a command with subcommands treat a stray argument as a usage error: cobra
// otherwise reports an unknown command as a plain error (exit 1). format takes the argument and
// the subcommands it may be a misspelling of ("; did you mean stats?", or nothing).
func noSuchCommand(format string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		var meant string
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			meant = "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return usageErrorf(format, args[0], meant)
	}
}

// noArgs is cobra.NoArgs as a usage error: cobra's is a plain error (exit 1).
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("%q takes no arguments, only flags, and was given %q (see '%s --help')", c.CommandPath(), args[0], c.CommandPath())
	}
	return nil
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
