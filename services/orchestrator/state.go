package orchestrator

import (
	"encoding/json"
	"math"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Run phases.
const (
	PhaseAwaitingVerdict = "awaiting_verdict" // iteration check published, no verdict yet
	PhaseAwaitingTools   = "awaiting_tools"   // tool calls published, envelopes pending
	PhaseCompleted       = "completed"
	PhaseFailed          = "failed"
)

// CallState is one tool call of a run.
type CallState struct {
	Seq            int                    `json:"seq"`
	Iteration      int                    `json:"iteration"`
	CallID         string                 `json:"call_id"`
	Name           string                 `json:"name"`
	Version        string                 `json:"version"`
	ProviderCallID string                 `json:"provider_call_id"`
	Input          json.RawMessage        `json:"input"`
	Envelope       *envelope.ToolEnvelope `json:"envelope,omitempty"`
	// Local marks a call the orchestrator answered itself (the model named no
	// valid tool): its envelope is published by the orchestrator.
	Local bool `json:"local,omitempty"`
	// Cost is the tool's declared cost when the call was requested; Billed
	// says whether it accrued to the spend (the tool ran and was not served
	// from the cache). UsageN numbers the call's usage event once its
	// envelope is recorded.
	Cost   float64 `json:"cost,omitempty"`
	Billed bool    `json:"billed,omitempty"`
	UsageN int     `json:"usage_n,omitempty"`
	// Approval is "" for a call that needs no decision, ApprovalWaiting while
	// it waits for one (the run is suspended) and ApprovalResumed once its
	// approval or completion arrived; ResumedBy says which.
	Approval  string `json:"approval,omitempty"`
	ResumedBy string `json:"resumed_by,omitempty"`
}

// Approval states of a call.
const (
	ApprovalWaiting = "waiting"
	ApprovalResumed = "resumed"
)

// TurnUsage is what one model turn cost.
type TurnUsage struct {
	Iteration    int     `json:"iteration"`
	InputTokens  int     `json:"input_tokens"`
	OutputTokens int     `json:"output_tokens"`
	Cost         float64 `json:"cost"`
	Unpriced     bool    `json:"unpriced,omitempty"`
	UsageN       int     `json:"usage_n"`
}

// ModelClaim records that a replica is calling the model for an iteration:
// another delivery of the same verdict waits for the claim to end (its turn is
// recorded) or to expire (its replica died) instead of calling the model a
// second time. Attempts counts the claims of the iteration; a model call that
// keeps getting interrupted ends the run.
type ModelClaim struct {
	Iteration int       `json:"iteration"`
	Attempts  int       `json:"attempts"`
	Owner     string    `json:"owner"`
	Until     time.Time `json:"until"`
}

// RunState is everything the orchestrator knows of a run, kept in KV.
type RunState struct {
	RunID     string                            `json:"run_id"`
	Request   envelope.RunRequest               `json:"request"`
	Phase     string                            `json:"phase"`
	Iteration int                               `json:"iteration"`
	Messages  []envelope.Message                `json:"messages"`
	Calls     []CallState                       `json:"calls"`
	Turns     []envelope.ModelTurn              `json:"turns"`
	Trace     events.RunTrace                   `json:"trace"`
	Warnings  []string                          `json:"warnings,omitempty"`
	Response  string                            `json:"response,omitempty"`
	Reason    string                            `json:"reason,omitempty"`
	Outputs   *envelope.AgentOutputs            `json:"outputs,omitempty"`
	Pinned    map[string]*envelope.ToolEnvelope `json:"pinned,omitempty"`
	// Code is the error code of a failed run, when one applies.
	Code envelope.ErrorCode `json:"code,omitempty"`
	// Spend is the run's cost so far (model turns and billed tool calls),
	// recomputed in a fixed order after every change so that it never depends
	// on the order in which envelopes arrived.
	Spend     float64     `json:"spend"`
	TurnUsage []TurnUsage `json:"turn_usage,omitempty"`
	// NextUsage is the number of the last usage event given out.
	NextUsage int         `json:"next_usage"`
	Claim     *ModelClaim `json:"claim,omitempty"`
	StartedAt time.Time   `json:"started_at"`
	UpdatedAt time.Time   `json:"updated_at"`
}

// turnUsage returns the usage of turn n, or nil.
func (s *RunState) turnUsage(n int) *TurnUsage {
	for i := range s.TurnUsage {
		if s.TurnUsage[i].Iteration == n {
			return &s.TurnUsage[i]
		}
	}
	return nil
}

// recomputeSpend sets Spend: model turns in iteration order, then billed
// calls in seq order.
func (s *RunState) recomputeSpend() {
	s.Spend = s.spendAt(math.MaxInt)
}

// spendAt is what the run had spent when the calls of iteration n were
// requested: every model turn up to n and every billed call of earlier turns.
// It depends on nothing but the recorded state, so a request re-published
// after a crash carries the same numbers.
func (s *RunState) spendAt(n int) float64 {
	total := 0.0
	for _, u := range s.TurnUsage {
		if u.Iteration <= n {
			total += u.Cost
		}
	}
	for _, c := range s.Calls {
		if c.Iteration < n && c.Billed {
			total += c.Cost
		}
	}
	return total
}

// Done reports whether the run has ended.
func (s *RunState) Done() bool { return s.Phase == PhaseCompleted || s.Phase == PhaseFailed }

// callsOf returns the calls of iteration n, in seq order.
func (s *RunState) callsOf(n int) []*CallState {
	var out []*CallState
	for i := range s.Calls {
		if s.Calls[i].Iteration == n {
			out = append(out, &s.Calls[i])
		}
	}
	return out
}

func (s *RunState) call(id string) *CallState {
	for i := range s.Calls {
		if s.Calls[i].CallID == id {
			return &s.Calls[i]
		}
	}
	return nil
}

func (s *RunState) turn(n int) *envelope.ModelTurn {
	for i := range s.Turns {
		if s.Turns[i].Iteration == n {
			return &s.Turns[i]
		}
	}
	return nil
}

// envelopes returns the envelopes of every completed call in seq order.
func (s *RunState) envelopes() []envelope.ToolEnvelope {
	out := make([]envelope.ToolEnvelope, 0, len(s.Calls))
	for _, c := range s.Calls {
		if c.Envelope != nil {
			out = append(out, *c.Envelope)
		}
	}
	return out
}
