package api

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// relayStep is one thing that happens to a deltaRelay: a delta comes
// (delta) or an event is sent (event); then the deltas it lets go (before
// the event, then after) are compared with want (seqs).
type relayStep struct {
	delta *events.Delta
	event *store.EventRow
	want  []int
}

func textDelta(iteration, seq int) *events.Delta {
	return &events.Delta{RunID: "r", Iteration: iteration, Attempt: 1, Seq: seq, Text: "x"}
}

func turnEvent(iteration int, calls ...string) *store.EventRow {
	data := fmt.Sprintf(`{"iteration":%d,"calls":[`, iteration)
	for i, c := range calls {
		if i > 0 {
			data += ","
		}
		data += `{"call_id":"` + c + `"}`
	}
	return &store.EventRow{RunID: "r", Type: events.TypeTurnCompleted, Data: []byte(data + "]}")}
}

func endEvent() *store.EventRow {
	return &store.EventRow{RunID: "r", Type: events.TypeRunCompleted, Data: []byte(`{"turn":{"iteration":2}}`)}
}

func completedEvent(call string) *store.EventRow {
	return &store.EventRow{RunID: "r", CallID: call, Type: events.TypeCallCompleted}
}

// TestDeltaRelay: a delta of the first model call goes at once; one of a
// later call waits for the previous turn and its calls' completions, or
// goes right before its own turn (or the end) when that comes first; one of
// a call whose turn was sent, or after the run's end, never goes.
func TestDeltaRelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []relayStep
	}{
		{"the first call's deltas go at once", []relayStep{
			{delta: textDelta(1, 1), want: []int{1}},
			{delta: textDelta(1, 2), want: []int{2}},
		}},
		{"a later call's wait for the turn before and its calls' completions", []relayStep{
			{delta: textDelta(2, 1)},
			{event: turnEvent(1, "a", "b")},
			{delta: textDelta(2, 2)},
			{event: completedEvent("a")},
			{event: completedEvent("b"), want: []int{1, 2}},
			{delta: textDelta(2, 3), want: []int{3}},
		}},
		{"a turn without calls lets the next call's go", []relayStep{
			{delta: textDelta(2, 1)},
			{event: turnEvent(1), want: []int{1}},
		}},
		{"none once its turn is sent", []relayStep{
			{delta: textDelta(1, 1), want: []int{1}},
			{event: turnEvent(1, "a")},
			{delta: textDelta(1, 2)},
		}},
		{"held ones go right before their turn when it comes before the calls", []relayStep{
			{delta: textDelta(2, 1)},
			{event: turnEvent(1, "a")},
			{delta: textDelta(2, 2)},
			{event: turnEvent(2), want: []int{1, 2}},
			{event: completedEvent("a")},
			{delta: textDelta(2, 3)},
		}},
		{"held ones of the last call go right before the end", []relayStep{
			{event: turnEvent(1, "a")},
			{delta: textDelta(2, 1)},
			{event: endEvent(), want: []int{1}},
		}},
		{"held ones whose previous turn never came are dropped", []relayStep{
			{delta: textDelta(3, 1)},
			{event: turnEvent(1)},
			{event: turnEvent(3)},
			{event: turnEvent(2)},
		}},
		{"none after the run's end", []relayStep{
			{delta: textDelta(2, 1)},
			{event: endEvent()},
			{event: turnEvent(1)},
			{delta: textDelta(2, 2)},
			{delta: textDelta(1, 1)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDeltaRelay()
			for i, s := range tc.steps {
				var pre []events.Delta
				switch {
				case s.delta != nil:
					require.True(t, r.add(*s.delta))
				case s.event != nil:
					pre = r.before(*s.event)
					r.sent(*s.event)
				}
				var got []int
				for _, d := range append(pre, r.release()...) {
					got = append(got, d.Seq)
				}
				require.Equal(t, s.want, got, "step %d", i)
			}
		})
	}
}

// TestDeltaRelayBoundsWhatItHolds: a stream holds at most maxHeldDeltas
// deltas that cannot go yet.
func TestDeltaRelayBoundsWhatItHolds(t *testing.T) {
	r := newDeltaRelay()
	for seq := 1; seq <= maxHeldDeltas; seq++ {
		require.True(t, r.add(*textDelta(2, seq)))
	}
	require.False(t, r.add(*textDelta(2, maxHeldDeltas+1)), "past the bound, dropped")
	r.sent(*turnEvent(1))
	require.Len(t, r.release(), maxHeldDeltas)
}

// TestWriteDeltas: a delta is an SSE message of event type delta, its data
// the delta's JSON, without an id.
func TestWriteDeltas(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, writeDeltas(&b, []events.Delta{*textDelta(1, 1),
		{RunID: "r", Iteration: 1, Attempt: 1, Seq: 2, Discarded: true}}))
	require.Equal(t, "event: delta\ndata: {\"run_id\":\"r\",\"iteration\":1,\"attempt\":1,\"seq\":1,\"text\":\"x\"}\n\n"+
		"event: delta\ndata: {\"run_id\":\"r\",\"iteration\":1,\"attempt\":1,\"seq\":2,\"discarded\":true}\n\n", b.String())
}
