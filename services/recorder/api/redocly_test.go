package api_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// TestOpenAPIRedoclyLint runs Redocly's linter with its recommended rules
// (@redocly/cli, pinned in scripts/redocly and installed by
// scripts/npm-install.sh) over openapi.yaml and fails on any error or
// warning, so that the document clients are generated from stays clean.
// Without node or the package the test fails when CI=true and is skipped
// otherwise, as docs' TestAsyncAPIValidates.
func TestOpenAPIRedoclyLint(t *testing.T) {
	const install = "run scripts/npm-install.sh (npm ci in scripts/redocly)"
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format+"; CI must not skip this test", args...)
		}
		t.Skipf(format, args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH (%v): install Node.js and npm (Debian: apt-get install nodejs npm), then %s", err, install)
		return
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(root, "scripts", "redocly", "node_modules", "@redocly", "cli", "bin", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		missing("scripts/redocly/node_modules/@redocly/cli is not installed: %s", install)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, cli, "lint", "--extends=recommended", "--max-problems=1000",
		filepath.Join("services", "recorder", "api", "openapi.yaml"))
	cmd.Dir = root
	// No telemetry, no update check: the test must not reach the network.
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_COLOR=1")
	b, err := cmd.CombinedOutput()
	t.Logf("%s", b)
	if err != nil {
		t.Fatalf("redocly lint found errors in openapi.yaml: %v", err)
	}
	// Warnings leave the exit status 0: the summary says whether there were any.
	if regexp.MustCompile(`(?i)\d+ warnings?`).Match(b) {
		t.Fatal("redocly lint reported warnings in openapi.yaml (see above)")
	}
	if !regexp.MustCompile(`(?i)your api description is valid`).Match(b) {
		t.Fatal("redocly lint did not say the document is valid (see above)")
	}
}
