// Command toolwire is the toolwire CLI: run the whole pipeline in one process
// (dev), submit runs (run), and more as the project grows.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolwire:", err)
		os.Exit(exitCode(err)) // exit.go
	}
}
