package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// ErrNoRequest is wrapped when a run's request has not been recorded (yet):
// without it there is nothing to replay, and no pinned handle to resolve.
var ErrNoRequest = errors.New("run request not recorded")

// ReplayBundle assembles a run's replay bundle (spec 6.4) from what s
// recorded: the request, the tool definitions as the model was offered them,
// the turns by iteration, the envelopes in call order, the outputs of a
// completed run, how the run stands and its iteration verdicts. It wraps
// ErrRunNotFound for a run s does not have, ErrNoRequest for one whose request
// it has not recorded.
func ReplayBundle(ctx context.Context, s Store, runID string) (envelope.ReplayBundle, error) {
	run, err := s.Run(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	if len(run.Request) == 0 {
		return envelope.ReplayBundle{}, fmt.Errorf("%w: run %q", ErrNoRequest, runID)
	}
	b := envelope.ReplayBundle{RunID: runID, Status: run.Status, Reason: run.Reason,
		Verdicts: []envelope.IterationVerdict{}}
	if err := json.Unmarshal(run.Request, &b.Request); err != nil {
		return envelope.ReplayBundle{}, fmt.Errorf("run %q: recorded request: %w", runID, err)
	}
	defs, err := s.RunTools(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	b.Tools = make([]envelope.ToolDefinition, 0, len(defs))
	for _, d := range defs {
		var def envelope.ToolDefinition
		if err := json.Unmarshal(d.Definition, &def); err != nil {
			return envelope.ReplayBundle{}, fmt.Errorf("run %q: definition of %s@%s: %w", runID, d.Name, d.Version, err)
		}
		b.Tools = append(b.Tools, def)
	}
	turns, err := s.Turns(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	b.Turns = make([]envelope.ModelTurn, 0, len(turns))
	for _, t := range turns {
		var turn envelope.ModelTurn
		if err := json.Unmarshal(t.Turn, &turn); err != nil {
			return envelope.ReplayBundle{}, fmt.Errorf("run %q: turn %d: %w", runID, t.Iteration, err)
		}
		b.Turns = append(b.Turns, turn)
	}
	envs, err := s.Envelopes(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	b.Envelopes = make([]envelope.ToolEnvelope, 0, len(envs))
	for _, raw := range envs {
		var env envelope.ToolEnvelope
		if err := json.Unmarshal(raw, &env); err != nil {
			return envelope.ReplayBundle{}, fmt.Errorf("run %q: envelope: %w", runID, err)
		}
		b.Envelopes = append(b.Envelopes, env)
	}
	if run.Status == events.StatusCompleted && len(run.Outputs) > 0 {
		var out envelope.AgentOutputs
		if err := json.Unmarshal(run.Outputs, &out); err != nil {
			return envelope.ReplayBundle{}, fmt.Errorf("run %q: outputs: %w", runID, err)
		}
		b.Outputs = &out
	}
	verdicts, err := s.Verdicts(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	for _, v := range verdicts {
		b.Verdicts = append(b.Verdicts, envelope.IterationVerdict{Iteration: v.Iteration, Allowed: v.Allowed,
			Code: envelope.ErrorCode(v.Code), Reason: v.Reason})
	}
	return b, nil
}
