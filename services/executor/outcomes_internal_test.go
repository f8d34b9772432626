package executor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

func testOutcomes(t *testing.T, owner string) *outcomes {
	t.Helper()
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), events.BucketOutcomes)
	require.NoError(t, err)
	return &outcomes{kv: kv, owner: owner, lease: 300 * time.Millisecond, now: time.Now,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), life: t.Context()}
}

// A writes call this process finished but could not record is recorded
// with its real outcome when the call comes again here, not declared
// unknown; another process's stale claim still is.
func TestUnrecordedOutcomeIsRecordedOnRetry(t *testing.T) {
	o := testOutcomes(t, "exec-1/aa")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	at := time.Now().UTC()
	_, _, err := o.claim(ctx, "run1.c1", at)
	require.NoError(t, err)
	done := envelope.ToolEnvelope{CallID: "c1", Name: "ledger_write", Version: "1.0.0", Output: json.RawMessage(`{"ok":true}`), TStart: at, TEnd: at}
	o.keepUnrecorded("run1.c1", done) // finish failed: the bucket did not answer

	unknown := func(rec outcomeRecord) envelope.ToolEnvelope { return unknownOutcome(done, rec, time.Now()) }
	env, recorded, found, err := o.resolve(ctx, "run1.c1", unknown)
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, recorded, "the real outcome, not unknown")
	require.Nil(t, env.Error)
	require.JSONEq(t, `{"ok":true}`, string(env.Output))
	rec, _, _, err := o.get(ctx, "run1.c1")
	require.NoError(t, err)
	require.Equal(t, outcomeDone, rec.State)

	// Another process's claim whose heartbeat stopped: unknown, as before.
	other := &outcomes{kv: o.kv, owner: "exec-2/bb", lease: o.lease, now: o.now, log: o.log, life: o.life}
	_, _, err = other.claim(ctx, "run1.c2", at)
	require.NoError(t, err)
	env, recorded, found, err = o.resolve(ctx, "run1.c2", unknown)
	require.NoError(t, err)
	require.True(t, found)
	require.False(t, recorded)
	require.Equal(t, envelope.CodeUnknown, env.Error.Code)
}

// The unrecorded outcomes are bounded.
func TestUnrecordedOutcomesAreBounded(t *testing.T) {
	var o outcomes
	for i := range maxUnrecorded + 10 {
		o.keepUnrecorded(string(rune('a'+i%26))+time.Duration(i).String(), envelope.ToolEnvelope{})
	}
	require.Len(t, o.unrecorded, maxUnrecorded)
	_, ok := o.takeUnrecorded("nope")
	require.False(t, ok)
}
