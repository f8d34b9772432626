package store_test

import (
	"testing"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// TestSettled: a run has settled once it has ended and every call it made
// (as many as it reports) has its envelope.
func TestSettled(t *testing.T) {
	done := store.ToolCall{Status: store.CallCompleted}
	for _, tc := range []struct {
		name  string
		run   store.Run
		calls []store.ToolCall
		want  bool
	}{
		{"completed, every call done", store.Run{Status: events.StatusCompleted, ToolCalls: 2}, []store.ToolCall{done, done}, true},
		{"failed, every call done", store.Run{Status: events.StatusFailed, ToolCalls: 1}, []store.ToolCall{done}, true},
		{"completed without calls", store.Run{Status: events.StatusCompleted}, nil, true},
		{"a call approved, no envelope yet", store.Run{Status: events.StatusCompleted, ToolCalls: 2},
			[]store.ToolCall{done, {Status: store.CallApproved}}, false},
		{"a call started", store.Run{Status: events.StatusFailed, ToolCalls: 2},
			[]store.ToolCall{done, {Status: store.CallStarted}}, false},
		{"a reported call not recorded at all", store.Run{Status: events.StatusCompleted, ToolCalls: 2}, []store.ToolCall{done}, false},
		{"still going", store.Run{Status: events.StatusStarted, ToolCalls: 1}, []store.ToolCall{done}, false},
		{"suspended", store.Run{Status: events.StatusSuspended}, nil, false},
		{"only requested", store.Run{Status: store.StatusRequested}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := store.Settled(tc.run, tc.calls); got != tc.want {
				t.Fatalf("Settled = %v, want %v", got, tc.want)
			}
		})
	}
}
