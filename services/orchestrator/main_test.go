package orchestrator_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine behind: every runner,
// watch and handler must be stopped by Stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
