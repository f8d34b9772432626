package orchestrator

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// history.turn finds turn n of a run wherever it is stored: its turn event,
// or the end event that carries the run's last turn, whichever event of the
// run came last; and says "not recorded" when neither holds it.
func TestHistoryTurn(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	h := &history{js: env.JS}
	var err error
	h.runs, err = env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)

	req := func(run string) events.Outgoing {
		o, err := events.NewRunRequested("/test", envelope.RunRequest{RunID: run, Tenant: envelope.Tenant{OrgID: "acme"},
			Agent:    envelope.Agent{Name: "a", Model: envelope.Model{Provider: "scripted", Name: "m"}},
			Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}, events.RunTrace{})
		require.NoError(t, err)
		return o
	}
	turn := func(run string, n int) events.Turn {
		return events.Turn{RunID: run, Iteration: n, Tenant: envelope.Tenant{OrgID: "acme"}, Agent: "a",
			Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{Content: fmt.Sprint("answer ", n)}}
	}
	turnEvent := func(run string, n int) events.Outgoing {
		o, err := events.NewTurnCompleted("/test", turn(run, n), events.RunTrace{})
		require.NoError(t, err)
		return o
	}
	status := func(run, st string, last *events.Turn) events.Outgoing {
		o, err := events.NewRunStatus("/test", events.RunStatus{RunID: run, Status: st, Tenant: envelope.Tenant{OrgID: "acme"}, Turn: last}, "", events.RunTrace{})
		require.NoError(t, err)
		return o
	}
	last := func(run string, n int) *events.Turn {
		tr := turn(run, n)
		return &tr
	}

	for i, tc := range []struct {
		name   string
		events func(run string) []events.Outgoing
		n      int
		found  bool
	}{
		{"only the request", func(r string) []events.Outgoing { return []events.Outgoing{req(r)} }, 1, false},
		{"the turn came last", func(r string) []events.Outgoing { return []events.Outgoing{req(r), turnEvent(r, 1)} }, 1, true},
		{"an earlier turn came last", func(r string) []events.Outgoing { return []events.Outgoing{req(r), turnEvent(r, 1)} }, 2, false},
		{"a started event after the turn", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), turnEvent(r, 1), status(r, events.StatusStarted, nil)}
		}, 1, true},
		{"a started event and no turn", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), status(r, events.StatusStarted, nil)}
		}, 1, false},
		{"the completed event carries it", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), turnEvent(r, 1), status(r, events.StatusCompleted, last(r, 2))}
		}, 2, true},
		{"the failed event carries it", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), turnEvent(r, 1), status(r, events.StatusFailed, last(r, 2))}
		}, 2, true},
		{"the end carries it, a started event came after", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), status(r, events.StatusCompleted, last(r, 1)), status(r, events.StatusStarted, nil)}
		}, 1, true},
		{"the end carries another turn", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), turnEvent(r, 1), status(r, events.StatusCompleted, last(r, 2))}
		}, 3, false},
		{"an earlier turn behind the end", func(r string) []events.Outgoing {
			return []events.Outgoing{req(r), turnEvent(r, 1), status(r, events.StatusCompleted, last(r, 2))}
		}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := fmt.Sprintf("hist-%d", i)
			env.Publish(t, tc.events(run)...)
			got, _, err := h.turn(ctx, run, tc.n)
			if !tc.found {
				require.True(t, errors.Is(err, errNotRecorded), "%v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.n, got.Iteration)
			require.Equal(t, fmt.Sprint("answer ", tc.n), got.Response.Content)
		})
	}
}
