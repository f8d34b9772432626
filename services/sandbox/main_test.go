package sandbox

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// service, engine and job the tests start must be over.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
