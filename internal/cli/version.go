package cli

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"
)

func newVersionCmd(version string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of tierblk",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVersion(cmd.OutOrStdout(), version)
		},
	}
}

func runVersion(w io.Writer, version string) error {
	_, err := fmt.Fprintln(w, versionLine(version))
	return err
}

// versionLine is what `tierblk version` and `tierblk --version` print: the version and the Go
// toolchain and platform it was built with.
func versionLine(version string) string {
	return fmt.Sprintf("tierblk %s (%s %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
