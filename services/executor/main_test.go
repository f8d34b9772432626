package executor

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// executor, watch and tool the tests start must be stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
