package events

import (
	"encoding/json"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Event types. Each names its data's Go type and JSON Schema (see DataSchema).
const (
	TypeRunRequested       = "dev.toolwire.run.requested.v1"           // data: envelope.RunRequest
	TypeRunStarted         = "dev.toolwire.run.started.v1"             // data: RunStatus
	TypeRunSuspended       = "dev.toolwire.run.suspended.v1"           // data: RunStatus
	TypeRunResumed         = "dev.toolwire.run.resumed.v1"             // data: RunStatus
	TypeRunCompleted       = "dev.toolwire.run.completed.v1"           // data: RunStatus (with outputs)
	TypeRunFailed          = "dev.toolwire.run.failed.v1"              // data: RunStatus (with reason)
	TypeIterationRequested = "dev.toolwire.run.iteration.requested.v1" // data: IterationCheck
	TypeIterationApproved  = "dev.toolwire.run.iteration.approved.v1"  // data: Verdict
	TypeIterationDenied    = "dev.toolwire.run.iteration.denied.v1"    // data: Verdict
	TypeLLMCompleted       = "dev.toolwire.run.llm.completed.v1"       // data: LLMCompleted
	TypeCallRequested      = "dev.toolwire.call.requested.v1"          // data: CallRequest
	TypeCallApproved       = "dev.toolwire.call.approved.v1"           // data: CallRequest
	TypeCallStarted        = "dev.toolwire.call.started.v1"            // data: CallStarted
	TypeCallCompleted      = "dev.toolwire.call.completed.v1"          // data: envelope.ToolEnvelope
)

// Approval event types (data in approval.go).
const (
	TypeCallApprovalRequired = "dev.toolwire.call.approval_required.v1" // data: ApprovalRequest
	TypeCallDecided          = "dev.toolwire.call.decided.v1"           // data: Decision
)

// Usage event type (data in usage.go).
const (
	TypeUsageRecorded = "dev.toolwire.run.usage.recorded.v1" // data: Usage
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
	RunID     string                            `json:"run_id"`
	Status    string                            `json:"status"`
	Agent     string                            `json:"agent,omitempty"`
	Tenant    envelope.Tenant                   `json:"tenant"`
	Reason    string                            `json:"reason,omitempty"`
	Warnings  []string                          `json:"warnings,omitempty"`
	Outputs   *envelope.AgentOutputs            `json:"outputs,omitempty"`
	Pinned    map[string]*envelope.ToolEnvelope `json:"pinned,omitempty"`
	TraceID   string                            `json:"trace_id,omitempty"`
	Iteration int                               `json:"iteration,omitempty"`
	ToolCalls int                               `json:"tool_calls,omitempty"`
	// Spend is what the run has cost so far: its model tokens priced by the
	// orchestrator's price table plus the declared cost of its executed tools.
	Spend float64 `json:"spend,omitempty"`
	// Code is the error code of a failed run when one applies (POLICY_DENIED
	// for a run the Policy Guard stopped).
	Code envelope.ErrorCode `json:"code,omitempty"`
}

// IterationCheck asks the Policy Guard whether iteration N of a run may call
// the model. It carries the run's policy so that the guard stays stateless.
type IterationCheck struct {
	RunID     string          `json:"run_id"`
	Iteration int             `json:"iteration"`
	Tenant    envelope.Tenant `json:"tenant"`
	Agent     string          `json:"agent"`
	Policy    envelope.Policy `json:"policy"`
	ToolCalls int             `json:"tool_calls"`
	Spend     float64         `json:"spend"`
	// MinCost is the least the model call asked for will cost: the tokens of
	// the previous call, which the next prompt repeats, at the model's input
	// price (0 for the first call or an unpriced model).
	MinCost float64 `json:"min_cost,omitempty"`
}

// Verdict is the Policy Guard's answer to an IterationCheck.
type Verdict struct {
	RunID     string             `json:"run_id"`
	Iteration int                `json:"iteration"`
	Allowed   bool               `json:"allowed"`
	Code      envelope.ErrorCode `json:"code,omitempty"`
	Reason    string             `json:"reason,omitempty"`
}

// LLMCompleted records one model call of a run.
type LLMCompleted struct {
	RunID string             `json:"run_id"`
	Turn  envelope.ModelTurn `json:"turn"`
}

// CallRequest asks for one tool call. The orchestrator publishes it (requested);
// the Policy Guard re-publishes it unchanged when it approves it (approved).
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
	EnabledTools   []string        `json:"enabled_tools"`
	Policy         envelope.Policy `json:"policy"`
	// Budget of the batch (the calls of one model turn), for max_budget:
	// Spend is the run's spend when the batch was requested, Cost the called
	// tool's declared cost, BatchCost the declared cost of the whole batch and
	// BatchCostBefore that of the batch's calls ahead of this one (lower seq).
	Spend           float64 `json:"spend,omitempty"`
	Cost            float64 `json:"cost,omitempty"`
	BatchCost       float64 `json:"batch_cost,omitempty"`
	BatchCostBefore float64 `json:"batch_cost_before,omitempty"`
	// OperatorApproved marks the approved request of a call that waited for
	// an operator's decision (the guard's own approvals leave it false): it
	// is what resumes a suspended run.
	OperatorApproved bool `json:"operator_approved,omitempty"`
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
