package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExitCode: each kind of error has its exit status, wrapped or not.
func TestExitCode(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"none", nil, exitOK},
		{"plain", errors.New("boom"), exitError},
		{"usage", usageError(errors.New("bad flag")), exitUsage},
		{"usage, wrapped", fmt.Errorf("run: %w", usageError(errors.New("bad flag"))), exitUsage},
		{"run failed", withCode(exitRunFailed, errors.New("run x failed")), exitRunFailed},
		{"not found", withCode(exitNotFound, errors.New("run x is not recorded")), exitNotFound},
		{"deadline", fmt.Errorf("follow: %w", context.DeadlineExceeded), exitTimeout},
		{"cancelled", fmt.Errorf("follow: %w", context.Canceled), exitInterrupted},
		{"connection refused", refused, exitUnreachable},
		{"unknown command", errors.New(`unknown command "runz" for "toolwire"`), exitUsage},
		{"required flag", errors.New(`required flag(s) "name" not set`), exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, exitCode(tc.err)) })
	}
}

// TestExitCodesAreDocumented: the help lists every exit status exit.go
// defines, and so does docs/operations.md.
func TestExitCodesAreDocumented(t *testing.T) {
	out, _, err := runCLI(t, "", "--help")
	require.NoError(t, err)
	b, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	for _, code := range []int{exitOK, exitError, exitUsage, exitRunFailed, exitTimeout, exitUnreachable, exitNotFound, exitInterrupted} {
		require.Regexp(t, fmt.Sprintf(`(?m)^  %d\s+\S`, code), out, "toolwire --help lists exit status %d", code)
		require.Contains(t, doc, fmt.Sprintf("| %d |", code), "docs/operations.md lists exit status %d", code)
	}
	require.True(t, strings.Contains(out, "Exit status:"), out)
}
