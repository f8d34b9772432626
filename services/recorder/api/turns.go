package api

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Turns returns a run's model turns by iteration, as GET
// /v1/runs/{run_id}/turns shows them and the timeline page draws them: each
// iteration that has a turn or a verdict, with the calls its turn made (calls
// is the run's tool calls, as store.ToolCalls returns them). Turns recorded
// before contract v2 (a ModelTurn, a verdict of their own) show the same way,
// without a cost.
func Turns(ctx context.Context, st store.Store, runID string, calls []store.ToolCall) ([]apitypes.TurnJSON, error) {
	rows, err := st.Turns(ctx, runID)
	if err != nil {
		return nil, err
	}
	verdicts, err := st.Verdicts(ctx, runID)
	if err != nil {
		return nil, err
	}
	byN := map[int]*apitypes.TurnJSON{}
	at := func(n int) *apitypes.TurnJSON {
		if byN[n] == nil {
			byN[n] = &apitypes.TurnJSON{Iteration: n, Tools: []string{}, Calls: []string{}}
		}
		return byN[n]
	}
	for _, row := range rows {
		doc, err := store.DecodeTurn(row)
		if err != nil {
			return nil, err
		}
		tj := at(row.Iteration)
		switch {
		case doc.Turn != nil:
			t := doc.Turn
			tj.Model = &apitypes.ModelJSON{Provider: t.Model.Provider, Name: t.Model.Name}
			tj.Response, tj.Unpriced, tj.Warnings = t.Response, t.Unpriced, t.Warnings
			cost, spend := t.Cost, t.Spend
			tj.Cost, tj.Spend = &cost, &spend
			tj.TStart, tj.TEnd = timeOrNil(t.TStart), timeOrNil(t.TEnd)
			if t.Tools != nil {
				tj.Tools = t.Tools
			}
		default:
			t := doc.Legacy
			tj.Model = &apitypes.ModelJSON{Provider: t.Model.Provider, Name: t.Model.Name}
			tj.Response = &t.Response
			tj.TStart, tj.TEnd = timeOrNil(t.TStart), timeOrNil(t.TEnd)
			if t.Tools != nil {
				tj.Tools = t.Tools
			}
		}
	}
	for _, v := range verdicts {
		at(v.Iteration).Verdict = &apitypes.VerdictJSON{Allowed: v.Allowed, Code: v.Code, Reason: v.Reason}
	}
	for _, c := range calls {
		if c.Iteration != nil {
			if tj, ok := byN[*c.Iteration]; ok {
				tj.Calls = append(tj.Calls, c.CallID)
			}
		}
	}
	out := make([]apitypes.TurnJSON, 0, len(byN))
	for _, tj := range byN {
		out = append(out, *tj)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Iteration < out[j].Iteration })
	return out, nil
}

func (a *api) getTurns(w http.ResponseWriter, r *http.Request) {
	run, calls, ok := a.runCalls(w, r)
	if !ok {
		return
	}
	turns, err := Turns(r.Context(), a.store, run.RunID, calls)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.TurnsJSON{RunID: run.RunID, Turns: turns})
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
