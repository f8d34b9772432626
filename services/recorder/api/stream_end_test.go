package api_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestStreamEndsOnceItsStreamsAreRead: a settled run's live stream ends as
// soon as every event its streams hold is recorded, not after a quiet
// period, and never before: a call event the calls stream holds but the
// store has not recorded yet (the recorder writes its streams
// concurrently) holds the end back until it is recorded and sent.
func TestStreamEndsOnceItsStreamsAreRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	env := eventstest.Start(t)
	st := sqlitetest.Store(t)
	fx := storetest.CompletedRun(t, "streams-read", "weather", storetest.TenantA, time.Now())
	env.Publish(t, fx.Events...)

	// Each event's place in its stream, as the recorder keeps it.
	recs := storetest.Records(t, fx.Events...)
	seq := map[string]uint64{}
	late := -1 // a call event, not the envelope: the run is settled without it
	for i := range recs {
		e := &recs[i].Event
		switch {
		case strings.HasPrefix(e.Subject, "toolwire.call."):
			e.Stream = events.StreamCalls
		case strings.HasPrefix(e.Subject, "toolwire.sandbox."):
			e.Stream = events.StreamSandbox
		default:
			e.Stream = events.StreamRuns
		}
		seq[e.Stream]++
		e.StreamSeq = seq[e.Stream]
		if e.Type == events.TypeCallStarted {
			late = i
		}
	}
	require.GreaterOrEqual(t, late, 0, "the fixture has a started call")
	for i, r := range recs {
		if i != late {
			require.NoError(t, st.Write(ctx, r))
		}
	}
	run, err := st.Run(ctx, fx.RunID)
	require.NoError(t, err)
	require.True(t, store.IsTerminal(run.Status), "the run has ended without the late event")

	changes := api.NewChanges()
	done := make(chan struct{})
	defer close(done)
	srv := httptest.NewServer(api.New(st, api.Options{Log: slog.New(slog.DiscardHandler), JS: env.JS, Changes: changes, Poll: time.Hour, Done: done}))
	defer srv.Close()

	// Record the late event once the stream has sent every other one: the
	// end cannot have been sent before it, whenever the stream looks.
	sent := make(chan []streamed, 1)
	go func() {
		got, end := readStream(t, ctx, srv.URL+"/v1/runs/streams-read/events/stream", "", "")
		sent <- append(got, streamed{typ: end})
	}()
	require.Eventually(t, func() bool {
		evs, err := st.EventsAfter(ctx, fx.RunID, 0, 100)
		return err == nil && len(evs) == len(recs)-1
	}, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // let the stream look at the settled run (more than one recheck)
	require.NoError(t, st.Write(ctx, recs[late]))
	changes.Notify(recs[late : late+1])

	var got []streamed
	select {
	case got = <-sent:
	case <-ctx.Done():
		t.Fatal("the stream did not end")
	}
	var ids []string
	for _, e := range got {
		ids = append(ids, e.id+e.typ)
	}
	require.Len(t, ids, len(recs)+1, "every event, then the end")
	require.Contains(t, ids[:len(recs)], recs[late].Event.ID+recs[late].Event.Type, "the late event was sent before the end")
	require.True(t, strings.HasPrefix(got[len(recs)].typ, "end "), "the stream ends with its end: %s", got[len(recs)].typ)
}
