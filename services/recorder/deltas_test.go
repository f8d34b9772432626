package recorder_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// streamed is one message of a live stream, read by the delta tests: a
// stored event (Event) or a delta (Delta).
type streamed struct {
	Event *streamedEvent
	Delta *events.Delta
	SSE   sseEvent
}

// label names what m is, for the order the tests compare: the event's type,
// or delta <iteration>.<seq>.
func (m streamed) label() string {
	switch {
	case m.Delta != nil:
		return fmt.Sprintf("delta %d.%d", m.Delta.Iteration, m.Delta.Seq)
	case m.Event != nil:
		return m.Event.Type
	}
	return "event: " + m.SSE.Event
}

// readStreamed reads the next message of s: a delta has no SSE id, a stored
// event its seq.
func readStreamed(t *testing.T, s *sseStream) streamed {
	t.Helper()
	ev, err := s.next()
	require.NoError(t, err)
	switch ev.Event {
	case "delta":
		require.Empty(t, ev.ID, "a delta has no SSE id: Last-Event-ID means the stored events'")
		d, err := events.DecodeDelta(deltaSubject(t, ev.Data), []byte(ev.Data))
		require.NoError(t, err, "a relayed delta is valid: %s", ev.Data)
		return streamed{Delta: &d, SSE: ev}
	case "":
		require.NotEmpty(t, ev.ID, "a stored event has its seq as SSE id")
		e := decode[streamedEvent](t, []byte(ev.Data))
		return streamed{Event: &e, SSE: ev}
	}
	return streamed{SSE: ev}
}

// deltaSubject is the subject the delta in data was published on.
func deltaSubject(t *testing.T, data string) string {
	t.Helper()
	var d events.Delta
	require.NoError(t, json.Unmarshal([]byte(data), &d))
	subj, err := events.DeltaSubject(d.RunID, d.Iteration)
	require.NoError(t, err)
	return subj
}

// readLabels reads n messages of s and returns what they are (label).
func readLabels(t *testing.T, s *sseStream, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	for range n {
		out = append(out, readStreamed(t, s).label())
	}
	return out
}

// textDeltas are deltas of run's model call iteration, numbered from
// seq, each with one of texts.
func textDeltas(run string, iteration, seq int, texts ...string) []events.Delta {
	out := make([]events.Delta, len(texts))
	for i, s := range texts {
		out[i] = events.Delta{RunID: run, Iteration: iteration, Attempt: 1, Seq: seq + i, Text: s}
	}
	return out
}

// deltaLabels are the labels of ds.
func deltaLabels(ds ...events.Delta) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = streamed{Delta: &d}.label()
	}
	return out
}

// splitRun cuts a CompletedRun's events: the request and start, the first
// turn, what its calls did, the end (which carries the second turn).
func splitRun(t *testing.T, fx *storetest.Run) (head []events.Outgoing, turn1 events.Outgoing, calls []events.Outgoing, end events.Outgoing) {
	t.Helper()
	require.Equal(t, events.TypeTurnCompleted, fx.Events[2].Event.Type())
	require.Equal(t, events.TypeRunCompleted, fx.Events[len(fx.Events)-1].Event.Type())
	return fx.Events[:2], fx.Events[2], fx.Events[3 : len(fx.Events)-1], fx.Events[len(fx.Events)-1]
}

// requireDeltasAfterCalls checks what a stream sent (got) once a first
// turn's calls were recorded and the second model call streamed: every
// event of the calls, and the second call's deltas in seq order after the
// calls' completions (the results the model was called with), and nothing
// else (no delta of the first call, whose turn was sent). The calls' other
// events may be recorded later than their completions, and come after.
func requireDeltasAfterCalls(t *testing.T, calls []events.Outgoing, second []events.Delta, got []string) {
	t.Helper()
	var want, gotEvents, gotDeltas []string
	for _, o := range calls {
		want = append(want, o.Event.Type())
	}
	lastCompleted := -1
	for i, l := range got {
		switch {
		case strings.HasPrefix(l, "delta "):
			gotDeltas = append(gotDeltas, l)
			continue
		case l == events.TypeCallCompleted:
			lastCompleted = i
		}
		gotEvents = append(gotEvents, l)
	}
	require.ElementsMatch(t, want, gotEvents, "sent: %v", got)
	require.Equal(t, deltaLabels(second...), gotDeltas, "sent: %v", got)
	require.Less(t, lastCompleted, slices.Index(got, gotDeltas[0]), "the deltas after the completions they follow; sent: %v", got)
}

// TestEventStreamRelaysDeltas: a client that follows a run from its start
// gets the model's deltas where they happened among the stored events: those
// of the first model call after the run's start and before its turn, those
// of the second after the first turn's calls have completed (even when they
// come before those calls are recorded) and before the run's end. A delta of
// a model call whose turn the client has is not sent, nor is an invalid one.
func TestEventStreamRelaysDeltas(t *testing.T) {
	h := newHarness(t)
	nc := h.env.Connect(t)
	fx := storetest.CompletedRun(t, "deltas-live", "weather", storetest.TenantA, time.Now())
	head, turn1, calls, end := splitRun(t, fx)
	h.publish(head...)
	s := h.stream(fx.RunID, "")
	require.Equal(t, []string{events.TypeRunRequested, events.TypeRunStarted}, readLabels(t, s, 2))

	// The first model call streams; invalid deltas on the run's subjects
	// go by too.
	first := textDeltas(fx.RunID, 1, 1, "Let me ", "search.")
	first = append(first,
		events.Delta{RunID: fx.RunID, Iteration: 1, Attempt: 1, Seq: 3, ToolCall: &events.DeltaToolCall{Index: 0, ID: "tc_1", Name: "web_search"}},
		events.Delta{RunID: fx.RunID, Iteration: 1, Attempt: 1, Seq: 4, ToolCall: &events.DeltaToolCall{Index: 0, Arguments: `{"query":`}})
	eventstest.PublishDeltas(t, nc, first[:2]...)
	subj1, err := events.DeltaSubject(fx.RunID, 1)
	require.NoError(t, err)
	for _, bad := range []string{
		`not json`,
		`{"run_id":"deltas-live","iteration":1,"attempt":1,"seq":0,"text":"no seq"}`,
		`{"run_id":"deltas-live","iteration":1,"attempt":1,"seq":9,"text":"two","discarded":true}`,
		`{"run_id":"deltas-live","iteration":2,"attempt":1,"seq":9,"text":"another iteration's subject"}`,
		`{"run_id":"someone-else","iteration":1,"attempt":1,"seq":9,"text":"another run's"}`,
		`{"run_id":"deltas-live","iteration":1,"attempt":1,"seq":9,"text":"` + strings.Repeat("x", events.MaxDeltaBytes) + `"}`,
	} {
		require.NoError(t, nc.Publish(subj1, []byte(bad)))
	}
	eventstest.PublishDeltas(t, nc, first[2:]...)
	require.Equal(t, deltaLabels(first...), readLabels(t, s, len(first)), "the valid deltas, in seq order; the invalid dropped")

	// The turn is recorded; a straggler of its model call comes after it,
	// then the second model call streams before the first turn's calls
	// are recorded.
	h.publish(turn1)
	require.Equal(t, []string{events.TypeTurnCompleted}, readLabels(t, s, 1))
	second := textDeltas(fx.RunID, 2, 1, "It is ", "sunny.")
	eventstest.PublishDeltas(t, nc, textDeltas(fx.RunID, 1, 5, "late")...)
	eventstest.PublishDeltas(t, nc, second...)
	h.publish(calls...)
	requireDeltasAfterCalls(t, calls, second, readLabels(t, s, len(calls)+len(second)))

	h.publish(end)
	require.Equal(t, []string{events.TypeRunCompleted, "event: end"}, readLabels(t, s, 2))
}

// TestEventStreamLateSubscriberGetsTheCurrentModelCall: a client that opens
// the stream while the model streams (the recorder holds the deltas of the
// run's current model call while any client watches it) gets the stored
// events, then the deltas so far, then the live ones, in seq order, none
// twice; one that opens it once the turn is recorded gets no delta of it.
func TestEventStreamLateSubscriberGetsTheCurrentModelCall(t *testing.T) {
	h := newHarness(t)
	nc := h.env.Connect(t)
	fx := storetest.CompletedRun(t, "deltas-late", "weather", storetest.TenantA, time.Now())
	head, turn1, calls, end := splitRun(t, fx)
	h.publish(head...)
	early := h.stream(fx.RunID, "")
	require.Equal(t, []string{events.TypeRunRequested, events.TypeRunStarted}, readLabels(t, early, 2))
	ds := textDeltas(fx.RunID, 1, 1, "Let ", "me ", "see", ", then ", "search.")
	eventstest.PublishDeltas(t, nc, ds[:3]...)
	require.Equal(t, deltaLabels(ds[:3]...), readLabels(t, early, 3))

	late := h.stream(fx.RunID, "")
	require.Equal(t, append([]string{events.TypeRunRequested, events.TypeRunStarted}, deltaLabels(ds[:3]...)...),
		readLabels(t, late, 5), "the stored events, then the deltas held")
	eventstest.PublishDeltas(t, nc, ds[3:]...)
	for name, s := range map[string]*sseStream{"early": early, "late": late} {
		require.Equal(t, deltaLabels(ds[3:]...), readLabels(t, s, 2), "%s: the live deltas after the held ones", name)
	}
	h.publish(turn1)
	for name, s := range map[string]*sseStream{"early": early, "late": late} {
		require.Equal(t, []string{events.TypeTurnCompleted}, readLabels(t, s, 1), name)
	}

	// Opened after the turn: the stored events, and none of its deltas.
	after := h.stream(fx.RunID, "")
	require.Equal(t, []string{events.TypeRunRequested, events.TypeRunStarted, events.TypeTurnCompleted}, readLabels(t, after, 3))
	h.publish(calls...)
	second := textDeltas(fx.RunID, 2, 1, "Sun", "ny.")
	eventstest.PublishDeltas(t, nc, second...)
	for name, s := range map[string]*sseStream{"early": early, "late": late, "after": after} {
		t.Log(name)
		requireDeltasAfterCalls(t, calls, second, readLabels(t, s, len(calls)+len(second)))
	}
	h.publish(end)
	for name, s := range map[string]*sseStream{"early": early, "late": late, "after": after} {
		require.Equal(t, []string{events.TypeRunCompleted, "event: end"}, readLabels(t, s, 2), name)
	}
}

// TestEventStreamDeltasAreTheTenantsOnly: a principal that may not see a run
// gets none of its deltas: its stream waits for a run it cannot see, then
// ends with an error, while the run's tenant's stream relays them.
func TestEventStreamDeltasAreTheTenantsOnly(t *testing.T) {
	w := newWritesEnv(t)
	nc := w.env.Connect(t)
	fx := storetest.StartedRun(t, "deltas-tenant", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, fx.Events...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/"+fx.RunID)
		return s == http.StatusOK, string(b)
	})
	open := func(who string) *bufio.Reader {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, w.srv.URL+"/v1/runs/"+fx.RunID+"/events/stream", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+w.tok[who])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return bufio.NewReader(resp.Body)
	}
	// lines reads s up to the first line that has prefix, and returns
	// what it read.
	lines := func(r *bufio.Reader, prefix string) string {
		var b strings.Builder
		for {
			line, err := r.ReadString('\n')
			b.WriteString(line)
			require.NoError(t, err, "read so far: %s", b.String())
			if strings.HasPrefix(line, prefix) {
				return b.String()
			}
		}
	}
	other := open("approver B")
	lines(other, ": waiting") // its stream watches the run, which it cannot see
	mine := open("viewer A")
	lines(mine, "id: 2") // the run's stored events are sent
	d := textDeltas(fx.RunID, 1, 1, "secret")
	eventstest.PublishDeltas(t, nc, d...)
	require.Contains(t, lines(mine, "data: {\"run_id\""), "event: delta")
	rest := lines(other, "event: error")
	require.NotContains(t, rest, "delta", "another tenant's stream relays no delta")
	require.NotContains(t, lines(other, "data:"), "secret")
}
