// Command tierblk is the tierblk daemon and its tools. It holds only main: the commands live in
// internal/cli.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tierblk/tierblk/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cli.NewRoot(version).ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tierblk:", err)
	}
	stop()
	os.Exit(cli.ExitCode(err))
}
