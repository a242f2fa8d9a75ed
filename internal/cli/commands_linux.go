package cli

import "github.com/spf13/cobra"

// platformCommands are the commands that serve and measure block devices: Linux only (io_uring,
// ublk, the kernel's NBD client).
func platformCommands(version string) []*cobra.Command {
	return []*cobra.Command{newServeCmd(), newBenchCmd(), newCSICmd(version), newReplicaCmd()}
}
