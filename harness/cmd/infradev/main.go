// Command infradev scores coding-agent patches on AI-infrastructure tasks. See package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/infradev/infradev/harness/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
