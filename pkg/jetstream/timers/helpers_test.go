package timers_test

import (
	"time"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
)

// Fixtures of eventstest, under the names this package's tests use.
var (
	testCtx     = eventstest.Context
	quietLogger = eventstest.QuietLogger
	streamMsgs  = eventstest.StreamMsgs
)

// shortBackoff keeps a failing handler's retries quick.
func shortBackoff(uint64) time.Duration { return 10 * time.Millisecond }
