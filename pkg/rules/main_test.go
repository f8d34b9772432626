package rules_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the suite if a test leaves a goroutine behind (the rules
// start none: this keeps it so).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
