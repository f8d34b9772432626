package recorder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// ErrNoRequest is wrapped when a run's request has not been recorded (yet):
// without it there is nothing to replay.
var ErrNoRequest = errors.New("run request not recorded")

// ReplayBundleJSON is GET /v1/runs/{run_id}/replay: the replay bundle of spec
// 6.4 (envelope.ReplayBundle: the initial request with its prompt, messages and
// model settings, the tool definitions as called, every model turn with its
// response, every envelope, the outputs), plus how the run ended and the
// Policy Guard's iteration verdicts, which a replay plays back too.
type ReplayBundleJSON struct {
	envelope.ReplayBundle
	Status   string        `json:"status"`
	Reason   string        `json:"reason,omitempty"`
	Verdicts []VerdictJSON `json:"verdicts"`
}

// VerdictJSON is one iteration verdict.
type VerdictJSON struct {
	Iteration int    `json:"iteration"`
	Allowed   bool   `json:"allowed"`
	Code      string `json:"code,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// BuildReplayBundle assembles a run's replay bundle from what store recorded.
// The envelopes are in call order; the turns by iteration.
func BuildReplayBundle(ctx context.Context, store Store, runID string) (ReplayBundleJSON, error) {
	run, err := store.Run(ctx, runID)
	if err != nil {
		return ReplayBundleJSON{}, err
	}
	if len(run.Request) == 0 {
		return ReplayBundleJSON{}, fmt.Errorf("%w: run %q", ErrNoRequest, runID)
	}
	b := ReplayBundleJSON{ReplayBundle: envelope.ReplayBundle{RunID: runID}, Status: run.Status, Reason: run.Reason,
		Verdicts: []VerdictJSON{}}
	if err := json.Unmarshal(run.Request, &b.Request); err != nil {
		return ReplayBundleJSON{}, fmt.Errorf("run %q: recorded request: %w", runID, err)
	}
	defs, err := store.RunTools(ctx, runID)
	if err != nil {
		return ReplayBundleJSON{}, err
	}
	b.Tools = make([]envelope.ToolDefinition, 0, len(defs))
	for _, d := range defs {
		var def envelope.ToolDefinition
		if err := json.Unmarshal(d.Definition, &def); err != nil {
			return ReplayBundleJSON{}, fmt.Errorf("run %q: definition of %s@%s: %w", runID, d.Name, d.Version, err)
		}
		b.Tools = append(b.Tools, def)
	}
	turns, err := store.Turns(ctx, runID)
	if err != nil {
		return ReplayBundleJSON{}, err
	}
	b.Turns = make([]envelope.ModelTurn, 0, len(turns))
	for _, t := range turns {
		var turn envelope.ModelTurn
		if err := json.Unmarshal(t.Turn, &turn); err != nil {
			return ReplayBundleJSON{}, fmt.Errorf("run %q: turn %d: %w", runID, t.Iteration, err)
		}
		b.Turns = append(b.Turns, turn)
	}
	envs, err := store.Envelopes(ctx, runID)
	if err != nil {
		return ReplayBundleJSON{}, err
	}
	b.Envelopes = make([]envelope.ToolEnvelope, 0, len(envs))
	for _, raw := range envs {
		var env envelope.ToolEnvelope
		if err := json.Unmarshal(raw, &env); err != nil {
			return ReplayBundleJSON{}, fmt.Errorf("run %q: envelope: %w", runID, err)
		}
		b.Envelopes = append(b.Envelopes, env)
	}
	if run.Status == events.StatusCompleted && len(run.Outputs) > 0 {
		var out envelope.AgentOutputs
		if err := json.Unmarshal(run.Outputs, &out); err != nil {
			return ReplayBundleJSON{}, fmt.Errorf("run %q: outputs: %w", runID, err)
		}
		b.Outputs = &out
	}
	verdicts, err := store.Verdicts(ctx, runID)
	if err != nil {
		return ReplayBundleJSON{}, err
	}
	for _, v := range verdicts {
		b.Verdicts = append(b.Verdicts, VerdictJSON{Iteration: v.Iteration, Allowed: v.Allowed, Code: v.Code, Reason: v.Reason})
	}
	return b, nil
}

func (a *api) getReplay(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	b, err := BuildReplayBundle(r.Context(), a.store, run.RunID)
	if errors.Is(err, ErrNoRequest) {
		writeError(w, http.StatusConflict, CodeNoRequest,
			fmt.Sprintf("run %q has no recorded request (yet): its replay bundle starts with it", run.RunID))
		return
	}
	if err != nil {
		a.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}
