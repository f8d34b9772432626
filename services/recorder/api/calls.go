package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// call reads the run and call named by the path, or writes the error.
func (a *api) call(w http.ResponseWriter, r *http.Request) (store.Run, store.ToolCall, bool) {
	run, ok := a.run(w, r)
	if !ok {
		return store.Run{}, store.ToolCall{}, false
	}
	id := r.PathValue("call_id")
	if events.ValidateCallID(id) != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidCallID,
			fmt.Sprintf("call_id %q is not a call id: a call id is lowercase hex, at most 64 digits", clip(id)))
		return store.Run{}, store.ToolCall{}, false
	}
	c, err := a.store.ToolCall(r.Context(), run.RunID, id)
	if errors.Is(err, store.ErrCallNotFound) {
		writeError(w, http.StatusNotFound, apitypes.CodeCallNotFound, fmt.Sprintf("run %q has no recorded call %q", run.RunID, id))
		return store.Run{}, store.ToolCall{}, false
	}
	if err != nil {
		a.internal(w, r, err)
		return store.Run{}, store.ToolCall{}, false
	}
	return run, c, true
}

// callEvents returns the recorded events of one call.
func (a *api) callEvents(r *http.Request, runID, callID string) ([]store.EventRow, error) {
	evs, err := a.store.Events(r.Context(), runID)
	if err != nil {
		return nil, err
	}
	out := []store.EventRow{}
	for _, e := range evs {
		if e.CallID == callID {
			out = append(out, e)
		}
	}
	return out, nil
}

func (a *api) getCall(w http.ResponseWriter, r *http.Request) {
	run, c, ok := a.call(w, r)
	if !ok {
		return
	}
	evs, err := a.callEvents(r, run.RunID, c.CallID)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	out := apitypes.CallJSON{ToolCallJSON: toolCallJSON(c), RunID: run.RunID, Input: c.Input, Envelope: c.Envelope, Events: eventsJSON(evs),
		Approval: approvalJSON(store.ApprovalOf(evs))}
	if len(out.Input) == 0 {
		out.Input = json.RawMessage("null")
	}
	if len(out.Envelope) == 0 {
		out.Envelope = json.RawMessage("null")
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getMaterialize(w http.ResponseWriter, r *http.Request) {
	run, c, ok := a.call(w, r)
	if !ok {
		return
	}
	if c.Name == "" || c.Version == "" || len(c.Input) == 0 {
		writeError(w, http.StatusConflict, apitypes.CodeCallNotFound,
			fmt.Sprintf("call %q of run %q has no recorded tool version and input yet", c.CallID, run.RunID))
		return
	}
	evs, err := a.callEvents(r, run.RunID, c.CallID)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	m, err := materializeCall(run, c, evs)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	defs, err := a.store.RunTools(r.Context(), run.RunID)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	for _, d := range defs {
		if d.Name == c.Name && d.Version == c.Version {
			m.Definition = d.Definition
		}
	}
	writeJSON(w, http.StatusOK, m)
}

// scopeRank orders secret scopes from narrow to broad.
var scopeRank = map[string]int{"user": 1, "workspace": 2, "org": 3}

// materializeCall builds a call's tool-node configuration.
func materializeCall(run store.Run, c store.ToolCall, evs []store.EventRow) (apitypes.MaterializedCallJSON, error) {
	ref := envelope.ToolRef{Name: c.Name, Version: c.Version}
	m := apitypes.MaterializedCallJSON{
		Kind: "tool_node", Tool: c.Name, Version: c.Version, Ref: ref.String(), Input: c.Input,
		Tenant: run.Tenant, SecretScopes: map[string]string{}, Definition: json.RawMessage("null"),
		Source: apitypes.MaterializedFromJSON{RunID: run.RunID, CallID: c.CallID, Agent: run.Agent, Seq: c.Seq, Iteration: c.Iteration},
	}
	for _, e := range evs {
		if e.Type != events.TypeCallStarted || len(e.Data) == 0 {
			continue
		}
		var s struct {
			SecretScopes map[string]string `json:"secret_scopes"`
		}
		if json.Unmarshal(e.Data, &s) == nil {
			for k, v := range s.SecretScopes {
				m.SecretScopes[k] = v
			}
		}
	}
	names := make([]string, 0, len(m.SecretScopes))
	for k := range m.SecretScopes {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if v := m.SecretScopes[k]; scopeRank[v] > scopeRank[m.SecretScope] {
			m.SecretScope = v
		}
	}
	var input any
	if err := json.Unmarshal(c.Input, &input); err != nil {
		return m, fmt.Errorf("call %s input: %w", c.CallID, err)
	}
	compact, err := json.Marshal(input)
	if err != nil {
		return m, err
	}
	m.Command = []string{"toolwire", "call", ref.String(), "--input", string(compact)}
	for _, f := range []struct{ flag, v string }{{"--org", run.Tenant.OrgID}, {"--workspace", run.Tenant.WorkspaceID},
		{"--user", run.Tenant.UserID}} {
		if f.v != "" {
			m.Command = append(m.Command, f.flag, f.v)
		}
	}
	return m, nil
}

// approvalJSON shows a call's approval; nil when it waited for none.
func approvalJSON(a store.Approval) *apitypes.ApprovalJSON {
	if a.State == "" {
		return nil
	}
	rows := func(ds []store.DecisionRow) []apitypes.DecisionJSON {
		out := make([]apitypes.DecisionJSON, 0, len(ds))
		for _, d := range ds {
			j := apitypes.DecisionJSON{Decision: d.Decision, By: d.By, Note: d.Note, EventID: d.Event, Why: d.Why}
			if !d.Time.IsZero() {
				at := d.Time
				j.Time = &at
			}
			out = append(out, j)
		}
		return out
	}
	out := &apitypes.ApprovalJSON{State: a.State, Ignored: rows(a.Ignored), Awaiting: rows(a.Awaiting)}
	if a.Applied != nil {
		out.Applied = &rows([]store.DecisionRow{*a.Applied})[0]
	}
	return out
}
