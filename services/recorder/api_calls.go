package recorder

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// CallJSON is GET /v1/runs/{run_id}/calls/{call_id}: the call's summary, its
// input, its envelope (null until it completes) and its recorded events.
type CallJSON struct {
	ToolCallJSON
	RunID    string          `json:"run_id"`
	Input    json.RawMessage `json:"input"`
	Envelope json.RawMessage `json:"envelope"`
	Events   []EventRow      `json:"events"`
}

// MaterializedCallJSON is GET /v1/runs/{run_id}/calls/{call_id}/materialize:
// one tool call of an agent run "ejected" as a standalone tool node (spec
// 8.1) - the exact tool version, its input, the tenant it ran for and the
// secret scopes it resolved - ready to paste into a graph as a node's
// configuration, or to run again with Command.
type MaterializedCallJSON struct {
	Kind    string          `json:"kind"` // "tool_node"
	Tool    string          `json:"tool"`
	Version string          `json:"version"`
	Ref     string          `json:"ref"` // name@version
	Input   json.RawMessage `json:"input"`
	Tenant  envelope.Tenant `json:"tenant"`
	// SecretScopes maps each secret the call resolved to the scope its value
	// came from (user, workspace or org), as the executor reported it; never a
	// value. Empty when the tool needs no secret.
	SecretScopes map[string]string `json:"secret_scopes"`
	// SecretScope is the broadest scope among them ("" without secrets): where
	// the node's credentials must be available for it to run the same way.
	SecretScope string `json:"secret_scope,omitempty"`
	// Definition is the tool's definition as the run's model was offered it
	// (null when the recorder could not read the registry).
	Definition json.RawMessage `json:"definition"`
	// Command runs the same call outside any loop.
	Command []string             `json:"command"`
	Source  MaterializedFromJSON `json:"source"`
}

// MaterializedFromJSON says which call a tool node was materialized from.
type MaterializedFromJSON struct {
	RunID     string `json:"run_id"`
	CallID    string `json:"call_id"`
	Agent     string `json:"agent"`
	Seq       *int   `json:"seq"`
	Iteration *int   `json:"iteration"`
}

// call reads the run and call named by the path, or writes the error.
func (a *api) call(w http.ResponseWriter, r *http.Request) (Run, ToolCall, bool) {
	run, ok := a.run(w, r)
	if !ok {
		return Run{}, ToolCall{}, false
	}
	id := r.PathValue("call_id")
	if events.ValidateCallID(id) != nil {
		if len(id) > 80 {
			id = id[:80] + "..."
		}
		writeError(w, http.StatusBadRequest, CodeInvalidCallID,
			fmt.Sprintf("call_id %q is not a call id: a call id is lowercase hex, at most 64 digits", id))
		return Run{}, ToolCall{}, false
	}
	c, err := a.store.ToolCall(r.Context(), run.RunID, id)
	if errors.Is(err, ErrCallNotFound) {
		writeError(w, http.StatusNotFound, CodeCallNotFound, fmt.Sprintf("run %q has no recorded call %q", run.RunID, id))
		return Run{}, ToolCall{}, false
	}
	if err != nil {
		a.internal(w, r, err)
		return Run{}, ToolCall{}, false
	}
	return run, c, true
}

// callEvents returns the recorded events of one call.
func (a *api) callEvents(r *http.Request, runID, callID string) ([]EventRow, error) {
	evs, err := a.store.Events(r.Context(), runID)
	if err != nil {
		return nil, err
	}
	out := []EventRow{}
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
	out := CallJSON{ToolCallJSON: toolCallJSON(c), RunID: run.RunID, Input: c.Input, Envelope: c.Envelope, Events: evs}
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
		writeError(w, http.StatusConflict, CodeCallNotFound,
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
func materializeCall(run Run, c ToolCall, evs []EventRow) (MaterializedCallJSON, error) {
	ref := envelope.ToolRef{Name: c.Name, Version: c.Version}
	m := MaterializedCallJSON{
		Kind: "tool_node", Tool: c.Name, Version: c.Version, Ref: ref.String(), Input: c.Input,
		Tenant: run.Tenant, SecretScopes: map[string]string{}, Definition: json.RawMessage("null"),
		Source: MaterializedFromJSON{RunID: run.RunID, CallID: c.CallID, Agent: run.Agent, Seq: c.Seq, Iteration: c.Iteration},
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
