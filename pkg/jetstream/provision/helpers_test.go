package provision_test

import "github.com/toolwire/toolwire/pkg/embedded/eventstest"

// Fixtures of eventstest, under the names this package's tests use.
var (
	testCtx     = eventstest.Context
	callStarted = eventstest.CallStarted
	runID       = eventstest.RunID
)
