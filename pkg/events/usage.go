package events

import (
	"fmt"
	"strconv"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// SchemaUsage names the JSON Schema of a Usage.
const SchemaUsage = "event_usage"

// Usage kinds.
const (
	UsageKindModel = "model" // one model turn: tokens at the model's price
	UsageKindTool  = "tool"  // one tool call: the tool's declared cost
)

// Usage is the data of a usage event: one billable use inside a run, a model
// turn or a tool call. The orchestrator publishes one per model turn and one
// per tool call on toolwire.run.<run_id>.usage.<n>, for billing and analytics
// exports; N numbers a run's usage events 1, 2, ... in the order the
// orchestrator recorded them, and never changes once given.
type Usage struct {
	RunID     string          `json:"run_id"`
	N         int             `json:"n"`
	Kind      string          `json:"kind"`
	Tenant    envelope.Tenant `json:"tenant"`
	Agent     string          `json:"agent"`
	Iteration int             `json:"iteration"`
	// Provider and Model name the model of a model turn.
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`
	// Tool (name@version, or the bare name of a call no version matched) and
	// CallID name the call of a tool usage.
	Tool         string `json:"tool,omitempty"`
	CallID       string `json:"call_id,omitempty"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	// Cost is in the unit of the price table (USD by default).
	Cost float64 `json:"cost"`
	// Unpriced marks a model turn whose model has no price: its cost is 0
	// because nothing is known, not because it was free.
	Unpriced bool `json:"unpriced,omitempty"`
	// Billed is false for a tool call that never ran (refused by policy,
	// rejected by validation) or was served from the cache: it costs nothing.
	Billed bool `json:"billed"`
}

// UsageSubject is toolwire.run.<run_id>.usage.<n>.
func UsageSubject(runID string, n int) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	if n < 1 {
		return "", fmt.Errorf("usage number %d must be at least 1", n)
	}
	return Prefix + ".run." + runID + ".usage." + strconv.Itoa(n), nil
}

// NewUsage builds a usage event. Its id is "<run_id>/usage/<n>".
func NewUsage(source string, u Usage, trace RunTrace) (Outgoing, error) {
	switch u.Kind {
	case UsageKindModel, UsageKindTool:
	default:
		return Outgoing{}, fmt.Errorf("%w: usage kind %q is not model or tool", ErrInvalidEvent, u.Kind)
	}
	if u.Cost < 0 || u.InputTokens < 0 || u.OutputTokens < 0 {
		return Outgoing{}, fmt.Errorf("%w: usage %d of run %s has a negative count or cost", ErrInvalidEvent, u.N, u.RunID)
	}
	subj, err := UsageSubject(u.RunID, u.N)
	if err != nil {
		return Outgoing{}, err
	}
	return Build(TypeUsageRecorded, u.RunID+"/usage/"+strconv.Itoa(u.N), subj,
		Attrs{Source: source, RunID: u.RunID, CallID: u.CallID, TenantID: u.Tenant.ID(), Trace: trace}, u)
}
