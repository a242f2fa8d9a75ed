//go:build !linux

package cli

import "github.com/spf13/cobra"

// platformCommands: serve, bench and csi need Linux; elsewhere tierblk has the simulator and the admin
// clients (stats, flush, mode, heal) for a daemon on another machine.
func platformCommands(string) []*cobra.Command { return nil }
