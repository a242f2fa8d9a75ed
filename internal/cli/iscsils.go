package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/iscsi"
)

func newISCSILsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "iscsi-ls " + iscsi.DiscoveryUsage,
		Short: "List the targets of an iSCSI portal (SendTargets discovery)",
		Long: `Asks an iSCSI portal for its targets (SendTargets discovery), logs in to each and prints one
line per disk LUN: a --backend URL for it on the portal given, its size, and the portals the target
reports. CHAP credentials come from the URL or from ` + iscsi.EnvUser + ` and ` + iscsi.EnvPassword + `,
as for the iscsi backend, and serve discovery and every target alike. A target that cannot be
listed is printed with LUN in place of the number, and its error goes to stderr.`,
		Example: `  tierblk iscsi-ls iscsi://nas.local
  TIERBLK_ISCSI_USER=tierblk TIERBLK_ISCSI_PASSWORD=... tierblk iscsi-ls iscsi://192.168.1.5:3260`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("give one portal: %s (see 'tierblk iscsi-ls --help')", iscsi.DiscoveryUsage)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runISCSILs(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], os.Getenv)
		},
	}
	return cmd
}

func runISCSILs(_ context.Context, stdout, stderr io.Writer, raw string, getenv func(string) string) error {
	u, err := iscsi.ParseURL(raw)
	if err != nil {
		return usageErrorf("%v", err)
	}
	targets, err := iscsi.Discover(u, getenv)
	var nerr interface{ Timeout() bool }
	switch {
	case errors.Is(err, backend.ErrBadURL):
		return usageErrorf("%v", err)
	case errors.As(err, &nerr):
		return fmt.Errorf("iscsi-ls: cannot reach %s: %w", u.Host, err)
	case err != nil:
		return fmt.Errorf("iscsi-ls: %w", err)
	}
	if len(targets) == 0 {
		fmt.Fprintf(stdout, "# %s reports no targets (or none this initiator may see)\n", u.Host)
	}
	failed := 0
	for _, t := range targets {
		portals := strings.Join(t.Portals, " ")
		luns, err := iscsi.LUNs(u, t.Name, getenv)
		if err != nil {
			fmt.Fprintf(stderr, "tierblk: iscsi-ls: %v\n", err)
			fmt.Fprintf(stdout, "iscsi://%s/%s/LUN\t?\t%s\n", u.Host, t.Name, portals)
			failed++
			continue
		}
		for _, l := range luns {
			fmt.Fprintf(stdout, "iscsi://%s/%s/%d\t%s\t%s\n", u.Host, t.Name, l.Number, units.FormatSize(l.Size), portals)
		}
	}
	if failed > 0 {
		return fmt.Errorf("iscsi-ls: %d of %d targets could not be listed", failed, len(targets))
	}
	return nil
}
