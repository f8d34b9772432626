package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
)

// The CLI's exit statuses: the one place they are defined. exitCodesHelp
// lists them in `toolwire --help`, and docs/operations.md, Exit statuses in
// the docs (exit_test.go checks both).
const (
	exitOK          = 0   // done
	exitError       = 1   // any other error
	exitUsage       = 2   // bad flags or arguments: nothing was sent
	exitRunFailed   = 3   // the run (or the call of `toolwire call --fail-on-error`) ended failed or cancelled
	exitTimeout     = 4   // --timeout passed before the answer came (a run goes on: `toolwire runs follow`)
	exitUnreachable = 5   // no NATS or recorder answered
	exitNotFound    = 6   // the run (or what else was named) is not recorded
	exitInterrupted = 130 // interrupted (SIGINT or SIGTERM); a run goes on
)

// exitCodesHelp is the table of exit statuses in the root command's help.
const exitCodesHelp = `Exit status:
  0    done
  1    any other error
  2    usage: bad flags or arguments, nothing was sent
  3    the run ended failed or cancelled (its status JSON is on standard output)
  4    --timeout passed first; a run goes on (reattach with toolwire runs follow RUN_ID)
  5    unreachable: no NATS (--nats) or recorder (--recorder) answered
  6    not found: the run is not recorded (or not your tenant's)
  130  interrupted; a run goes on`

// codedError is an error with the exit status it means.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// withCode gives err the exit status code; nil stays nil.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &codedError{code: code, err: err}
}

// usageError is a mistake in the command line.
func usageError(err error) error { return withCode(exitUsage, err) }

// exitCode is the exit status err means: the code it was given, else
// unreachable for a refused or unanswered connection, timeout for a
// deadline, interrupted for a cancellation, else exitError.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &ue) && (errors.As(err, new(*net.OpError)) || errors.As(err, new(*net.DNSError))):
		return exitUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return exitTimeout
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case isCobraUsage(err):
		return exitUsage
	}
	return exitError
}

// isCobraUsage tells the errors cobra returns for a command line it could
// not take before a command ran (an unknown command); flags and arguments
// are marked by markUsage.
func isCobraUsage(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ") || strings.HasPrefix(err.Error(), "required flag(s) ")
}

// markUsage makes the errors of flag parsing and argument checks of cmd and
// every command below it usage errors.
func markUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return usageError(fmt.Errorf("%s: %w (see %s --help)", c.CommandPath(), err, c.CommandPath()))
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsage(sub)
	}
}
