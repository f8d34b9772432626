package executor

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// executor, watch and tool the tests start must be stopped.
func TestMain(m *testing.M) {
	if code, served := runTestMCPServerIfAsked(); served {
		os.Exit(code) // the binary ran as the stdio MCP server of mcp_test.go
	}
	goleak.VerifyTestMain(m)
}
