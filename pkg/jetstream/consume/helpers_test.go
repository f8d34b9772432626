package consume_test

import "github.com/toolwire/toolwire/pkg/embedded/eventstest"

// Fixtures of eventstest, under the names this package's tests use.
var (
	testCtx     = eventstest.Context
	quietLogger = eventstest.QuietLogger
	hexID       = eventstest.HexID
	callStarted = eventstest.CallStarted
	streamMsgs  = eventstest.StreamMsgs
	lastMsg     = eventstest.LastMsg
	runID       = eventstest.RunID
	runTrace    = eventstest.RunTrace
	tenant      = eventstest.Tenant
	callID      = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)
