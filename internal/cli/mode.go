package cli

import (
	"context"
	"fmt"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/cache"
)

func newModeCmd() *cobra.Command {
	o := actionOpts{}
	cmd := &cobra.Command{
		Use:   "mode writethrough|writearound|passthrough|writeback",
		Short: "Switch the cache mode of a running daemon's export",
		Long: `Switches the cache of an export of a running daemon to another mode. Leaving write-back, new
writes stop being absorbed at once (they take the new mode's way), then the dirty data is written
back, with the progress and an estimate of the time left shown; the command returns once the
backend holds everything, and it ends while clients keep writing, since nothing new is dirtied.
Interrupted, the cache stays in the new mode and writes the rest back in the background. Switching
to write-back needs an SSD tier. The switch lasts until the daemon stops: the next start takes the
configured mode.`,
		Example: `  tierblk mode --admin unix:/run/tierblk/admin.sock writethrough
  tierblk mode --admin 127.0.0.1:9810 --export nas writeback`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("give one mode: writethrough, writearound, passthrough or writeback (see 'tierblk mode --help')")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.bind(cmd)
			return runMode(cmd.Context(), o, args[0])
		},
	}
	o.flags(cmd)
	return cmd
}

func runMode(ctx context.Context, o actionOpts, mode string) error {
	if _, err := cache.ParseMode(mode); err != nil {
		return usageErrorf("%v", err)
	}
	if err := runAction(ctx, o, "mode", url.Values{"mode": {mode}}); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "%s: mode %s\n", exportLabel(o.export), mode)
	return nil
}
