package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// staleLookbackRuns is how many earlier completed runs are searched for a
// stale value.
const staleLookbackRuns = 50

// ResolvePins resolves the pinned handles of a run's agent node. A handle's
// value is selected from the run's calls (the completed run's outputs, or the
// envelopes recorded so far for a run that did not complete). When nothing is
// selected, on_missing decides: null and error give null (error also says the
// node fails), and stale_last_success serves the value from the last
// successful run of the same agent node (the same agent name in the same
// tenant: org, workspace and user, each exactly as the run has them) whose
// calls the handle selects from, looking back over at most 50 earlier
// completed runs. Outputs a completed event left in a blob are read with
// read (nil: such a run's own outputs are an error; an earlier run's are
// skipped).
func ResolvePins(ctx context.Context, st store.Store, run store.Run, read store.BlobReader) (apitypes.PinsJSON, error) {
	out := apitypes.PinsJSON{RunID: run.RunID, Status: run.Status, Pins: []apitypes.PinJSON{}}
	if len(run.Request) == 0 {
		return out, fmt.Errorf("%w: run %q", store.ErrNoRequest, run.RunID)
	}
	var req envelope.RunRequest
	if err := json.Unmarshal(run.Request, &req); err != nil {
		return out, fmt.Errorf("run %q: recorded request: %w", run.RunID, err)
	}
	if len(req.Agent.PinnedHandles) == 0 {
		return out, nil
	}
	outputs, err := outputsOf(ctx, st, run, read)
	if err != nil {
		return out, err
	}
	var earlier []envelope.AgentOutputs // loaded once, when a stale value is wanted
	var earlierIDs []string
	loaded := false
	for _, p := range req.Agent.PinnedHandles {
		pj := apitypes.PinJSON{Name: p.Name, Selector: p.Selector, OnMissing: p.OnMissing, Source: apitypes.PinMissing}
		if pj.OnMissing == "" {
			pj.OnMissing = envelope.MissingNull
		}
		if env := p.Select(outputs); env != nil {
			pj.Value, pj.Source = env, apitypes.PinFromRun
			out.Pins = append(out.Pins, pj)
			continue
		}
		switch pj.OnMissing {
		case envelope.MissingError:
			pj.Error = fmt.Sprintf("pinned handle %q selected no call of %s (on_missing: error): the node fails", p.Name, p.Selector.Tool)
		case envelope.MissingStaleLastSuccess:
			if !loaded {
				loaded = true
				if earlierIDs, earlier, err = completedOutputs(ctx, st, run, read); err != nil {
					return out, err
				}
			}
			for i, o := range earlier {
				if env := p.Select(o); env != nil {
					pj.Value, pj.Source, pj.FromRunID = env, apitypes.PinFromStale, earlierIDs[i]
					break
				}
			}
		}
		out.Pins = append(out.Pins, pj)
	}
	return out, nil
}

// outputsOf is a completed run's outputs, or for any other run the outputs its
// recorded envelopes would make.
func outputsOf(ctx context.Context, st store.Store, run store.Run, read store.BlobReader) (envelope.AgentOutputs, error) {
	if run.Status == events.StatusCompleted {
		raw, _, err := store.RunOutputs(ctx, run, read)
		if err != nil {
			return envelope.AgentOutputs{}, err
		}
		if len(raw) > 0 {
			var out envelope.AgentOutputs
			if err := json.Unmarshal(raw, &out); err != nil {
				return out, fmt.Errorf("run %q: outputs: %w", run.RunID, err)
			}
			return out, nil
		}
	}
	raws, err := st.Envelopes(ctx, run.RunID)
	if err != nil {
		return envelope.AgentOutputs{}, err
	}
	envs := make([]envelope.ToolEnvelope, 0, len(raws))
	for _, raw := range raws {
		var env envelope.ToolEnvelope
		if err := json.Unmarshal(raw, &env); err != nil {
			return envelope.AgentOutputs{}, fmt.Errorf("run %q: envelope: %w", run.RunID, err)
		}
		envs = append(envs, env)
	}
	return envelope.NewAgentOutputs("", envs, ""), nil
}

// completedOutputs returns the outputs of the node's earlier completed runs,
// newest first.
func completedOutputs(ctx context.Context, st store.Store, run store.Run, read store.BlobReader) ([]string, []envelope.AgentOutputs, error) {
	if run.Tenant.OrgID == "" || run.Agent == "" {
		return nil, nil, nil
	}
	// Only the runs of the run's own tenant, whole (org, workspace and
	// user): another workspace's or user's run of the same agent name is
	// not this node's, and its outputs are not this reader's to see.
	runs, err := st.CompletedRuns(ctx, run.Tenant, run.Agent, run.CreatedAt, staleLookbackRuns)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]string, 0, len(runs))
	outs := make([]envelope.AgentOutputs, 0, len(runs))
	for _, r := range runs {
		if r.Tenant != run.Tenant {
			continue // never another tenant's, whatever the store returned
		}
		raw, _, err := store.RunOutputs(ctx, r, read)
		if err != nil || len(raw) == 0 {
			continue // an earlier run whose outputs cannot be read selects nothing
		}
		var o envelope.AgentOutputs
		if json.Unmarshal(raw, &o) != nil {
			continue
		}
		ids = append(ids, r.RunID)
		outs = append(outs, o)
	}
	return ids, outs, nil
}

func (a *api) getPins(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	pins, err := ResolvePins(r.Context(), a.store, run, a.blobReader())
	if err != nil {
		if errors.Is(err, store.ErrNoRequest) {
			writeError(w, http.StatusConflict, apitypes.CodeNoRequest,
				fmt.Sprintf("run %q has no recorded request (yet): its pinned handles are configured there", run.RunID))
			return
		}
		a.blobError(w, r, run, err)
		return
	}
	writeJSON(w, http.StatusOK, pins)
}
