// Command release keeps toolwire's modules requirable at a release and
// proves it (docs/development.md, "Modules and releases"):
//
//	go run ./scripts/release version vX.Y.Z  # every sibling requirement and go.work at vX.Y.Z
//	go run ./scripts/release tidy            # go mod tidy in every module, siblings from the checkout
//	go run ./scripts/release pack DIR        # every module into a file-based module proxy at DIR
//	go run ./scripts/release check           # a fresh module outside the checkout requires the worker and the client
//
// The modules are those go.work uses. Each requires its siblings at the
// release version and none has a replace directive; go.work points that
// version at the checkout for local development.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage: release version vX.Y.Z | tidy | pack DIR | check [-keep]")

func run(ctx context.Context, args []string) (err error) {
	if len(args) == 0 {
		return errUsage
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	ws, err := loadWorkspace(root)
	if err != nil {
		return err
	}
	switch args[0] {
	case "version":
		if len(args) != 2 {
			return errUsage
		}
		return ws.setVersion(args[1])
	case "tidy":
		return ws.tidy(ctx)
	case "pack":
		if len(args) != 2 {
			return errUsage
		}
		if err := ws.checkConsistent(); err != nil {
			return err
		}
		return ws.pack(args[1], ws.version)
	case "check":
		keep := len(args) == 2 && args[1] == "-keep"
		return ws.check(ctx, keep)
	}
	return errUsage
}
