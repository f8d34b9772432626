package events_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// runner, watcher, connection and embedded server must be stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
