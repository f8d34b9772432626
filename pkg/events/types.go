package events

import (
	"encoding/json"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Event types. Each names its data's Go type and JSON Schema; events.Table
// has every fact about each.
const (
	TypeRunRequested  = "dev.toolwire.run.requested.v1"      // data: envelope.RunRequest
	TypeRunStarted    = "dev.toolwire.run.started.v1"        // data: RunStatus
	TypeRunSuspended  = "dev.toolwire.run.suspended.v1"      // data: RunStatus
	TypeRunResumed    = "dev.toolwire.run.resumed.v1"        // data: RunStatus
	TypeRunCompleted  = "dev.toolwire.run.completed.v1"      // data: RunStatus (with outputs)
	TypeRunFailed     = "dev.toolwire.run.failed.v1"         // data: RunStatus (with reason)
	TypeTurnCompleted = "dev.toolwire.run.turn.completed.v1" // data: Turn
	TypeCallApproved  = "dev.toolwire.call.approved.v1"      // data: CallRequest
	TypeCallStarted   = "dev.toolwire.call.started.v1"       // data: CallStarted
	TypeCallCompleted = "dev.toolwire.call.completed.v1"     // data: envelope.ToolEnvelope
)

// Approval event types (data in approval.go).
const (
	TypeCallApprovalRequired = "dev.toolwire.call.approval_required.v1" // data: ApprovalRequest
	TypeCallDecided          = "dev.toolwire.call.decided.v1"           // data: Decision
)

// Sandbox event types (data in sandbox.go).
const (
	TypeSandboxRequested = "dev.toolwire.sandbox.requested.v1" // data: SandboxJob
	TypeSandboxCompleted = "dev.toolwire.sandbox.completed.v1" // data: SandboxResult
)

// Run statuses carried by RunStatus.
const (
	StatusStarted   = "started"
	StatusSuspended = "suspended"
	StatusResumed   = "resumed"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// RunStatus is the data of the run lifecycle events.
type RunStatus struct {
	RunID    string          `json:"run_id"`
	Status   string          `json:"status"`
	Agent    string          `json:"agent,omitempty"`
	Tenant   envelope.Tenant `json:"tenant"`
	Reason   string          `json:"reason,omitempty"`
	Warnings []string        `json:"warnings,omitempty"`
	// Outputs and Pinned are the outputs of a completed run, carried in the
	// event when they are small; OutputsBlob instead names the blob holding
	// both (an OutputsDocument) when they are not, so that no event grows
	// with the number of calls a run made (client.Outputs reads either).
	Outputs     *envelope.AgentOutputs            `json:"outputs,omitempty"`
	Pinned      map[string]*envelope.ToolEnvelope `json:"pinned,omitempty"`
	OutputsBlob *envelope.Attachment              `json:"outputs_blob,omitempty"`
	TraceID     string                            `json:"trace_id,omitempty"`
	Iteration   int                               `json:"iteration,omitempty"`
	ToolCalls   int                               `json:"tool_calls,omitempty"`
	// Spend is what the run has cost so far: its model tokens priced by the
	// orchestrator's price table plus the declared cost of its executed tools.
	Spend float64 `json:"spend,omitempty"`
	// Code is the error code of a failed run when one applies (POLICY_DENIED
	// for a run the Policy Guard stopped).
	Code envelope.ErrorCode `json:"code,omitempty"`
	// Turn is the run's last model turn when that turn ended the run: the
	// model's final answer (a turn without calls) on a completed run, or the
	// model call the loop rules denied on a failed one. Such a turn is not
	// published as a turn event of its own: the end event carries it, so
	// that a run stores one event fewer. A consumer that reads a run's turns
	// reads the turn events and this one.
	Turn *Turn `json:"turn,omitempty"`
}

// OutputsDocument is the blob of a completed run's outputs when they are
// too large for its completed event (RunStatus.OutputsBlob).
type OutputsDocument struct {
	Outputs *envelope.AgentOutputs            `json:"outputs"`
	Pinned  map[string]*envelope.ToolEnvelope `json:"pinned,omitempty"`
}

// Turn is one model turn of a run, the data of
// toolwire.run.<run_id>.turn.<n>.completed: the verdict of the loop rules
// before the model call, what was new in the model's request, its response
// and cost, and the tool calls it made, with what the Policy Guard needs to
// judge them (the agent's policy and enabled tools, the run's spend), so that
// the guard keeps no state. It never holds the conversation: a turn's size
// depends on the model's answer, not on the run's length.
type Turn struct {
	RunID     string          `json:"run_id"`
	Iteration int             `json:"iteration"`
	Tenant    envelope.Tenant `json:"tenant"`
	Agent     string          `json:"agent"`
	// Verdict is the loop rules' verdict on this model call; a denied turn
	// has no response and ends the run (its failed event follows).
	Verdict LoopVerdict `json:"verdict"`
	Model   ModelRef    `json:"model"`
	// Tools are the tools offered to the model, as name@version.
	Tools []string `json:"tools,omitempty"`
	// Results are what this turn's request added to the conversation: the
	// results of the previous turn's calls, in order (their envelopes are in
	// their completed events). The first turn's request is the run request.
	Results []TurnResult `json:"results,omitempty"`
	// Response is the model's answer; nil on a denied turn.
	Response *envelope.ModelResponse `json:"response,omitempty"`
	// Cost is what the model call cost at the orchestrator's prices;
	// Unpriced marks a model without a price (its cost is 0 for want of
	// one). Billing reads model cost here and tool cost on the envelopes.
	Cost     float64   `json:"cost"`
	Unpriced bool      `json:"unpriced,omitempty"`
	TStart   time.Time `json:"t_start"`
	TEnd     time.Time `json:"t_end"`
	// Policy and EnabledTools are the agent's; Spend is what the run had
	// cost when the turn's calls were made (this model call included).
	Policy       envelope.Policy `json:"policy"`
	EnabledTools []string        `json:"enabled_tools"`
	Spend        float64         `json:"spend"`
	// Calls are the tool calls of the response, in order.
	Calls []TurnCall `json:"calls,omitempty"`
	// Warnings are findings that do not stop the run (a deprecated tool),
	// given on its first turn.
	Warnings []string `json:"warnings,omitempty"`
	// Deadline is the run's deadline: no call of the turn starts after it
	// (its guard and executors drop such a call), and a call running then
	// is cut at it. Nil on turns of runs recorded before it was carried.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Output is the final answer's value once agent.output_schema accepted
	// it (a final turn only).
	Output json.RawMessage `json:"output,omitempty"`
	// Rejected says the answer failed agent.output_schema: it goes back to
	// the model with the problems, and the run's next model call follows.
	// A rejected turn has no calls.
	Rejected *OutputRejection `json:"rejected,omitempty"`
}

// OutputRejection is why a final answer went back to the model.
type OutputRejection struct {
	Problems []string `json:"problems"`
	// Attempt counts the run's rejections from 1.
	Attempt int `json:"attempt"`
}

// LoopVerdict is the loop rules' verdict on one model call.
type LoopVerdict struct {
	Allowed bool               `json:"allowed"`
	Code    envelope.ErrorCode `json:"code,omitempty"`
	Reason  string             `json:"reason,omitempty"`
	Rule    string             `json:"rule,omitempty"`
}

// ModelRef names a model without its options (a scripted model's options
// hold its whole script).
type ModelRef struct {
	Provider string `json:"provider"`
	Name     string `json:"name"`
}

// TurnResult is one tool result a turn's request carried.
type TurnResult struct {
	CallID         string `json:"call_id"`
	ProviderCallID string `json:"provider_call_id,omitempty"`
	IsError        bool   `json:"is_error,omitempty"`
}

// TurnCall is one tool call of a turn.
type TurnCall struct {
	CallID         string          `json:"call_id"`
	Seq            int             `json:"seq"`
	Name           string          `json:"name"`
	Version        string          `json:"version"`
	Input          json.RawMessage `json:"input"`
	ProviderCallID string          `json:"provider_call_id,omitempty"`
	// Cost is the tool's declared cost when the turn was made.
	Cost float64 `json:"cost,omitempty"`
	// Queue is the queue of the tool's workers (envelope.DefaultQueue when
	// the tool names none).
	Queue string `json:"queue,omitempty"`
	// Answered marks a call the orchestrator answered itself (the model named
	// no valid tool, or arguments that no tool can take): its completed event
	// comes from the orchestrator, and the guard leaves it alone.
	Answered bool `json:"answered,omitempty"`
}

// Ref is the called tool's name@version.
func (c *TurnCall) Ref() envelope.ToolRef { return envelope.ToolRef{Name: c.Name, Version: c.Version} }

// CallRequest is one approved tool call, the data of
// toolwire.call.<run_id>.<call_id>.approved.<queue>: what the workers of the
// queue need to run it.
type CallRequest struct {
	RunID          string          `json:"run_id"`
	CallID         string          `json:"call_id"`
	Seq            int             `json:"seq"`
	Iteration      int             `json:"iteration"`
	Name           string          `json:"name"`
	Version        string          `json:"version"`
	Input          json.RawMessage `json:"input"`
	ProviderCallID string          `json:"provider_call_id,omitempty"`
	Tenant         envelope.Tenant `json:"tenant"`
	Agent          string          `json:"agent"`
	// Queue is the queue the call is routed to.
	Queue string `json:"queue"`
	// OperatorApproved marks the approved request of a call that waited for
	// an operator's decision (the guard's own approvals leave it false).
	OperatorApproved bool `json:"operator_approved,omitempty"`
	// Gate is the gate matrix's verdict on the call and the cell that gave
	// it (docs/policy.md, Gates).
	Gate *envelope.GateVerdict `json:"gate,omitempty"`
	// RunDeadline is the run's deadline (its turn's Deadline): a call is not
	// started after it, and a running one is cut at it, so that nothing of
	// a run that ended at its deadline runs on. Nil for a call outside a
	// run's loop (`toolwire call`).
	RunDeadline *time.Time `json:"run_deadline,omitempty"`
}

// PastRunDeadline reports whether the call's run has a deadline and now is
// past it.
func (c *CallRequest) PastRunDeadline(now time.Time) bool {
	return c.RunDeadline != nil && now.After(*c.RunDeadline)
}

// Ref is the called tool's name@version.
func (c *CallRequest) Ref() envelope.ToolRef {
	return envelope.ToolRef{Name: c.Name, Version: c.Version}
}

// CallStarted announces that an executor began a call.
type CallStarted struct {
	RunID    string    `json:"run_id"`
	CallID   string    `json:"call_id"`
	Name     string    `json:"name"`
	Version  string    `json:"version"`
	TStart   time.Time `json:"t_start"`
	Executor string    `json:"executor,omitempty"`
	// SecretScopes names, for each secret the call resolved, the scope its
	// value came from (user, workspace or org); never the value.
	SecretScopes map[string]string `json:"secret_scopes,omitempty"`
	// Warnings are findings that do not stop the call, such as a secret that
	// fell back to the broad org scope.
	Warnings []string `json:"warnings,omitempty"`
}
