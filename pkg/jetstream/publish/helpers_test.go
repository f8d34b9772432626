package publish_test

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
)

// Fixtures of eventstest, under the names this package's tests use.
var (
	testCtx     = eventstest.Context
	callStarted = eventstest.CallStarted
	streamMsgs  = eventstest.StreamMsgs
	lastMsg     = eventstest.LastMsg
	runID       = eventstest.RunID
	runTrace    = eventstest.RunTrace
	callID      = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

// specialEvent has attribute values that need percent-encoding in headers.
func specialEvent(t testing.TB) *event.Event {
	t.Helper()
	e := event.New()
	e.SetID(`id with spaces "and" 100% ünïcödé`)
	e.SetSource("/toolwire/test")
	e.SetType("dev.toolwire.test.v1")
	e.SetSubject("tab\there\r\nnewline \x7f del")
	e.SetTime(eventstest.T0)
	e.SetExtension(events.ExtTenantID, `acme/R&D "west"/zoë`)
	e.SetExtension(events.ExtRunID, runID)
	e.SetExtension("emoji", "🚀 launch")
	e.SetExtension("empty", "")
	require.NoError(t, e.SetData("text/plain; charset=utf-8", []byte("plain text ✓")))
	return &e
}
