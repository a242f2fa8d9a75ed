package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
)

func newHealCmd() *cobra.Command {
	o := actionOpts{}
	cmd := &cobra.Command{
		Use:   "heal",
		Short: "Bring a running daemon's bypassed SSD tier back into service now",
		Long: `A daemon bypasses its SSD tier when the SSD or the tier's metadata fails (tierblk stats shows
BYPASSED and why), keeps the tier's clean lines set aside, and tries to bring it back by itself,
after 5 s and then at doubling intervals up to 5 minutes. heal tries at once: the SSD must take a
probe write and a flush, and the metadata a commit; the tier then serves the lines it held again
(less any written meanwhile). It exits 0 once the tier is in service, and says why it is not
otherwise.`,
		Example: `  tierblk heal --admin unix:/run/tierblk/admin.sock
  tierblk heal --admin 127.0.0.1:9810 --export nas`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.bind(cmd)
			return runHeal(cmd.Context(), o)
		},
	}
	o.flags(cmd)
	return cmd
}

func runHeal(ctx context.Context, o actionOpts) error {
	if err := runAction(ctx, o, "heal", nil); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "%s: the SSD tier is in service\n", exportLabel(o.export))
	return nil
}
