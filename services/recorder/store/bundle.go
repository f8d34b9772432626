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

// ReplayBundle assembles a run's replay bundle (docs/recorder.md, HTTP API and
// Replay) from what s recorded: the request, the tool definitions as the model
// was offered them, the turns by iteration, the envelopes in call order (by
// seq), the outputs of a completed run, how the run stands and the loop rules'
// verdicts.
//
// The bundle is of version envelope.ReplayBundleVersion: its turns carry no
// messages (the conversation is the request, the turns and the envelopes),
// their model is the request's, and a turn the loop rules denied, which
// called no model, is among the verdicts only. A run recorded before
// contract v2 gives a version 1 bundle (no version), its turns with their
// messages.
//
// Outputs that the completed event left in a blob are read with read; without
// one (nil) the bundle has no outputs, and a replay compares the outcome by
// status alone. It wraps ErrRunNotFound for a run s does not have,
// ErrNoRequest for one whose request it has not recorded.
func ReplayBundle(ctx context.Context, s Store, runID string, read BlobReader) (envelope.ReplayBundle, error) {
	run, err := s.Run(ctx, runID)
	if err != nil {
		return envelope.ReplayBundle{}, err
	}
	if len(run.Request) == 0 {
		return envelope.ReplayBundle{}, fmt.Errorf("%w: run %q", ErrNoRequest, runID)
	}
	b := envelope.ReplayBundle{Version: envelope.ReplayBundleVersion, RunID: runID, Status: run.Status,
		Reason: run.Reason, Verdicts: []envelope.IterationVerdict{}}
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
		doc, err := DecodeTurn(t)
		if err != nil {
			return envelope.ReplayBundle{}, err
		}
		if doc.Legacy != nil {
			b.Version = 0 // recorded before contract v2: a version 1 bundle
		}
		if mt, ok := doc.ModelTurn(b.Request.Agent.Model); ok {
			b.Turns = append(b.Turns, mt)
		}
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
	if run.Status == events.StatusCompleted {
		outputs, _, err := RunOutputs(ctx, run, read)
		switch {
		case errors.Is(err, ErrOutputsInBlob):
		case err != nil:
			return envelope.ReplayBundle{}, err
		case len(outputs) > 0:
			var out envelope.AgentOutputs
			if err := json.Unmarshal(outputs, &out); err != nil {
				return envelope.ReplayBundle{}, fmt.Errorf("run %q: outputs: %w", runID, err)
			}
			b.Outputs = &out
		}
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
