// Package apitypes holds the recorder's HTTP API as Go types: the JSON of
// every response (openapi.yaml documents them), the error codes, and the
// constants the responses use. It imports nothing but the contracts
// (pkg/envelope, the registry's entry types) and the standard library, so
// that clients, `toolwire replay` among them, read the API without the
// recorder's database drivers. A run's replay bundle is envelope.ReplayBundle.
package apitypes

import (
	"encoding/json"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// Error codes of the HTTP API, in {"error": {"code": ..., "message": ...}}.
const (
	CodeInvalidRunID     = "invalid_run_id"
	CodeInvalidParameter = "invalid_parameter"
	CodeRunNotFound      = "run_not_found"
	CodeRunNotCompleted  = "run_not_completed"
	CodeRunFailed        = "run_failed"
	CodeNoRequest        = "run_request_missing"
	CodeCallNotFound     = "call_not_found"
	CodeInvalidCallID    = "invalid_call_id"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
	// CodeBlobNotFound: a completed run's outputs are in a blob that the
	// object store no longer holds.
	CodeBlobNotFound = "blob_not_found"
)

// Error codes of the tool catalog and the admin routes.
const (
	CodeAdminDisabled = "admin_disabled"
	CodeUnauthorized  = "unauthorized"
	// CodeForbidden: the principal is authenticated but its role may not do
	// this (a viewer deciding an approval, a tenant's admin changing the
	// shared registry).
	CodeForbidden    = "forbidden"
	CodeInvalidTool  = "invalid_tool"
	CodeToolConflict = "tool_conflict"
	CodeToolNotFound = "tool_not_found"
)

// Error codes of the write routes (POST /v1/runs, /cancel, /decision).
const (
	// CodeInvalidJSON: the body is not one JSON value.
	CodeInvalidJSON = "invalid_json"
	// CodeUnknownField: the body has a field the request does not have.
	CodeUnknownField = "unknown_field"
	// CodeInvalidRequest: the body is JSON but not a valid request; the
	// error's details list every problem.
	CodeInvalidRequest       = "invalid_request"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeTenantMismatch: the body names another tenant than the
	// credential's.
	CodeTenantMismatch = "tenant_mismatch"
	// CodeRunIDInUse: the run id holds another request, or another
	// tenant's run.
	CodeRunIDInUse = "run_id_in_use"
	// CodeAlreadyDecided: the call's approval is settled (decided, timed
	// out or withdrawn).
	CodeAlreadyDecided = "already_decided"
	// CodeAmbiguousCallID: a short call id matches several calls.
	CodeAmbiguousCallID = "ambiguous_call_id"
)

// StatusCancelling is the status POST /v1/runs/{run_id}/cancel answers for
// a run whose cancel request it published.
const StatusCancelling = "cancelling"

// SubmitJSON answers POST /v1/runs (200 for a repeat, 201 for a new run).
type SubmitJSON struct {
	RunID string `json:"run_id"`
	// Status is the run's as recorded, or "requested" before it is.
	Status  string `json:"status"`
	Created bool   `json:"created"`
}

// CancelRequestJSON is the optional body of POST /v1/runs/{run_id}/cancel.
type CancelRequestJSON struct {
	Reason string `json:"reason,omitempty"`
}

// CancelJSON answers POST /v1/runs/{run_id}/cancel: 202 with status
// cancelling when the cancel request was published, 200 with the run's end
// when it had ended.
type CancelJSON struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	Cancelled bool   `json:"cancelled"`
}

// DecisionRequestJSON is the body of POST /v1/runs/{run_id}/calls/{call_id}/decision.
type DecisionRequestJSON struct {
	Decision string `json:"decision"`
	Note     string `json:"note,omitempty"`
}

// DecidedJSON answers a decision published (202).
type DecidedJSON struct {
	RunID    string `json:"run_id"`
	CallID   string `json:"call_id"`
	Decision string `json:"decision"`
}

// ErrorJSON is the body of every error response.
type ErrorJSON struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is an error's stable code and human message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Details lists the problems of an invalid_request, one per line.
	Details []string `json:"details,omitempty"`
}

// RunListJSON is GET /v1/runs.
type RunListJSON struct {
	Runs []RunJSON `json:"runs"`
}

// RunJSON is a run as the API shows it.
type RunJSON struct {
	RunID       string          `json:"run_id"`
	Tenant      envelope.Tenant `json:"tenant"`
	Agent       string          `json:"agent"`
	Status      string          `json:"status"`
	Reason      string          `json:"reason"`
	TraceID     string          `json:"trace_id"`
	Counts      CountsJSON      `json:"counts"`
	Spend       *float64        `json:"spend"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	CompletedAt *time.Time      `json:"completed_at"`
}

// CountsJSON counts a run's model iterations and tool calls.
type CountsJSON struct {
	Iterations int `json:"iterations"`
	ToolCalls  int `json:"tool_calls"`
}

// RunDetailJSON is GET /v1/runs/{run_id}: the run, its request as received
// (null until it arrives), its resolved pinned handles once completed, and its
// tool calls in order. A completed run whose outputs were too large for its
// event names their blob (OutputsBlob) instead of carrying its pinned
// handles; /outputs and /pins read it.
type RunDetailJSON struct {
	RunJSON
	Request     json.RawMessage      `json:"request"`
	Pinned      json.RawMessage      `json:"pinned,omitempty"`
	OutputsBlob *envelope.Attachment `json:"outputs_blob,omitempty"`
	// Settled: the run has ended and every tool call it made has its
	// envelope recorded. A run's calls are recorded apart from the run
	// itself, so a run can read as ended a moment before its last calls do.
	Settled   bool           `json:"settled"`
	ToolCalls []ToolCallJSON `json:"tool_calls"`
}

// ToolCallJSON summarizes one tool call, for the timeline: the full receipt is
// in /envelopes.
type ToolCallJSON struct {
	CallID    string     `json:"call_id"`
	Seq       *int       `json:"seq"`
	Iteration *int       `json:"iteration"`
	Name      string     `json:"name"`
	Version   string     `json:"version"`
	Status    string     `json:"status"`
	ErrorCode *string    `json:"error_code"`
	TStart    *time.Time `json:"t_start"`
	TEnd      *time.Time `json:"t_end"`
	LatencyMS *int64     `json:"latency_ms"`
	Cached    bool       `json:"cached"`
	Truncated bool       `json:"truncated"`
	// Queue is the queue the call was routed to (null until it is approved).
	Queue *string `json:"queue"`
	// Cost is what the call cost the run, as its envelope says (null until
	// it completes, or for a call recorded before envelopes carried it).
	Cost *float64 `json:"cost"`
}

// TurnsJSON is GET /v1/runs/{run_id}/turns: the run's model turns by
// iteration.
type TurnsJSON struct {
	RunID string     `json:"run_id"`
	Turns []TurnJSON `json:"turns"`
}

// TurnJSON is one iteration of a run's loop: the loop rules' verdict on its
// model call, what the model answered and what that cost, and the calls it
// made. A denied turn has a verdict and no response.
type TurnJSON struct {
	Iteration int `json:"iteration"`
	// Verdict is null when none was recorded.
	Verdict *VerdictJSON `json:"verdict"`
	// Model is the model called (null when no turn was recorded for a
	// verdict, as for a run recorded before contract v2 that was denied).
	Model *ModelJSON `json:"model"`
	// Tools are the tools offered to the model, as name@version.
	Tools []string `json:"tools"`
	// Response is the model's answer (null: the model was not called).
	Response *envelope.ModelResponse `json:"response"`
	// Cost is what the model call cost at the orchestrator's prices (null
	// for a turn recorded before contract v2); Unpriced marks a model
	// without a price.
	Cost     *float64 `json:"cost"`
	Unpriced bool     `json:"unpriced,omitempty"`
	// Spend is what the run had cost when the turn's calls were made.
	Spend  *float64   `json:"spend"`
	TStart *time.Time `json:"t_start"`
	TEnd   *time.Time `json:"t_end"`
	// Calls are the call ids of the tool calls the turn made, by seq (their
	// summaries are in the run's tool_calls).
	Calls    []string `json:"calls"`
	Warnings []string `json:"warnings,omitempty"`
}

// VerdictJSON is the loop rules' verdict on one model call.
type VerdictJSON struct {
	Allowed bool   `json:"allowed"`
	Code    string `json:"code,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// ModelJSON names a model.
type ModelJSON struct {
	Provider string `json:"provider"`
	Name     string `json:"name"`
}

// EnvelopesJSON is GET /v1/runs/{run_id}/envelopes.
type EnvelopesJSON struct {
	RunID     string            `json:"run_id"`
	Envelopes []json.RawMessage `json:"envelopes"`
}

// EventsJSON is GET /v1/runs/{run_id}/events: recorded events in recorded
// order; next_after pages on (pass it as ?after=).
type EventsJSON struct {
	RunID     string      `json:"run_id"`
	Events    []EventJSON `json:"events"`
	NextAfter int64       `json:"next_after"`
}

// EventJSON is one recorded CloudEvent, as GET /v1/runs/{run_id}/events and
// the live stream show it.
type EventJSON struct {
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Source  string    `json:"source"`
	Subject string    `json:"subject"` // the NATS subject it was delivered on
	Time    time.Time `json:"time"`
	RunID   string    `json:"run_id,omitempty"`
	CallID  string    `json:"call_id,omitempty"`
	// Stream and StreamSeq locate the event in JetStream (empty when the
	// event did not come from a stream).
	Stream    string `json:"stream,omitempty"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
	// Extensions are the CloudEvents extension attributes (runid, callid,
	// tenantid, traceparent, ...), so that the event can be republished as
	// it was.
	Extensions map[string]string `json:"extensions,omitempty"`
	Data       json.RawMessage   `json:"data,omitempty"`
	// RecordedAt is when the recorder stored it.
	RecordedAt time.Time `json:"recorded_at"`
	// Seq is the recorder's order of events: a live stream's event id (pass
	// the last one as ?after= to page on).
	Seq int64 `json:"seq"`
}

// StreamEndJSON is the data of the stream's final "end" event.
type StreamEndJSON struct {
	RunID  string `json:"run_id"`
	Status string `json:"status"`
}

// CallJSON is GET /v1/runs/{run_id}/calls/{call_id}: the call's summary, its
// input, its envelope (null until it completes) and its recorded events.
type CallJSON struct {
	ToolCallJSON
	RunID    string          `json:"run_id"`
	Input    json.RawMessage `json:"input"`
	Envelope json.RawMessage `json:"envelope"`
	Events   []EventJSON     `json:"events"`
	// Approval is the call's approval, for a call that waited for one.
	Approval *ApprovalJSON `json:"approval,omitempty"`
}

// ApprovalJSON is a call's approval as its events record it: the decision
// the Policy Guard applied (shown by its outcome: the call approved, or
// its POLICY_DENIED completion), not the last one recorded, and the ones
// it ignored.
type ApprovalJSON struct {
	// State is pending, approved, denied, revised or expired.
	State string `json:"state"`
	// Applied is the decision that took effect (null while pending and for
	// an expired approval).
	Applied *DecisionJSON `json:"applied"`
	// Ignored are the decisions the guard did not apply, each with why.
	Ignored []DecisionJSON `json:"ignored"`
	// Awaiting are decisions recorded before the guard's outcome.
	Awaiting []DecisionJSON `json:"awaiting"`
}

// DecisionJSON is one operator's decision on a call.
type DecisionJSON struct {
	Decision string `json:"decision"`
	By       string `json:"by,omitempty"`
	Note     string `json:"note,omitempty"`
	// EventID is the decided event's id; "" when the outcome shows a
	// decision that is not recorded.
	EventID string     `json:"event_id,omitempty"`
	Time    *time.Time `json:"time,omitempty"`
	// Why says why an ignored decision was.
	Why string `json:"why,omitempty"`
}

// MaterializedCallJSON is GET /v1/runs/{run_id}/calls/{call_id}/materialize:
// one tool call of an agent run "ejected" as a standalone tool node
// (docs/recorder.md, HTTP API) - the exact tool version, its input, the tenant
// it ran for and the secret scopes it resolved - ready to paste into a graph
// as a node's configuration, or to run again with Command.
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

// Sources of a pinned handle's value.
const (
	PinFromRun   = "run"                // selected from this run's calls
	PinFromStale = "stale_last_success" // from an earlier successful run of the node
	PinMissing   = "missing"            // nothing selected: the value is null
)

// PinsJSON is GET /v1/runs/{run_id}/pins.
type PinsJSON struct {
	RunID  string    `json:"run_id"`
	Status string    `json:"status"`
	Pins   []PinJSON `json:"pins"`
}

// PinJSON is one pinned handle of the agent node and its value for the run.
type PinJSON struct {
	Name      string                 `json:"name"`
	Selector  envelope.PinSelector   `json:"selector"`
	OnMissing envelope.OnMissing     `json:"on_missing"`
	Value     *envelope.ToolEnvelope `json:"value"`
	// Source says where Value comes from: run, stale_last_success or missing.
	Source string `json:"source"`
	// FromRunID is the run a stale value was taken from.
	FromRunID string `json:"from_run_id,omitempty"`
	// Error is set when nothing was selected and on_missing is error: the
	// node fails on this handle.
	Error string `json:"error,omitempty"`
}

// CatalogJSON is GET /v1/tools.
type CatalogJSON struct {
	Tools []CatalogToolJSON `json:"tools"`
}

// CatalogToolJSON is one tool version of the catalog: what a tool selector
// shows, with the tenant's auth status.
type CatalogToolJSON struct {
	Ref         string               `json:"ref"`
	Name        string               `json:"name"`
	Version     string               `json:"version"`
	Description string               `json:"description"`
	Category    envelope.Category    `json:"category"`
	SideEffects envelope.SideEffects `json:"side_effects"`
	// Kind is how it is run: builtin, http, mcp, sandbox, or worker (a
	// tool on a worker's queue); Queue is the queue it is routed to.
	Kind           string         `json:"kind"`
	Queue          string         `json:"queue"`
	State          registry.State `json:"state"`
	Deprecated     bool           `json:"deprecated"`
	RequiredScopes []string       `json:"required_scopes"`
	Auth           AuthStatusJSON `json:"auth"`
	// What a tool's detail shows: its schemas, cache policy, timeout, and
	// the processes serving its queue now (their last heartbeat holds).
	InputSchema  json.RawMessage      `json:"input_schema"`
	OutputSchema json.RawMessage      `json:"output_schema,omitempty"`
	Cache        envelope.CachePolicy `json:"cache"`
	CacheTTLS    int                  `json:"cache_ttl_s,omitempty"`
	TimeoutMS    int                  `json:"timeout_ms"`
	LiveWorkers  []LiveWorkerJSON     `json:"live_workers"`
	Health       ToolHealthJSON       `json:"health"`
	// RateLimit is the tool's rate limit and where the tenant asked about
	// stands in it; absent for a tool without one.
	RateLimit *RateLimitStatusJSON `json:"rate_limit,omitempty"`
}

// RateLimitStatusJSON is a tool's rate limit (a token bucket per tenant
// and tool: burst calls back to back, refilled at per_s) and, when a
// tenant is given and its bucket can be read, how many calls it may make
// now and, when none, when the next one may go.
type RateLimitStatusJSON struct {
	PerS      float64    `json:"per_s"`
	Burst     int        `json:"burst"`
	Remaining *int       `json:"remaining,omitempty"`
	ResetsAt  *time.Time `json:"resets_at,omitempty"`
}

// Health statuses of a catalog tool, from the executors' circuits.
const (
	HealthHealthy     = "healthy"     // no executor's circuit counts a failure
	HealthDegraded    = "degraded"    // some executor's circuit failed lately, or is open
	HealthUnavailable = "unavailable" // every live executor's circuit is open: calls fail at once
)

// ToolHealthJSON is a tool's health across the live executors: the status,
// the most consecutive failures one counts, the latest failure's code, and
// when the first open circuit lets a trial call through.
type ToolHealthJSON struct {
	Status              string     `json:"status"`
	ConsecutiveFailures uint32     `json:"consecutive_failures"`
	LastFailure         string     `json:"last_failure,omitempty"`
	OpenUntil           *time.Time `json:"open_until,omitempty"`
}

// LiveWorkerJSON is a process serving a tool's queue: an executor, or a
// worker process (remote).
type LiveWorkerJSON struct {
	ID     string    `json:"id"`
	Remote bool      `json:"remote"`
	SeenAt time.Time `json:"seen_at"`
}

// Auth statuses of a catalog tool.
const (
	AuthNone    = "none"    // the tool needs no secret
	AuthReady   = "ready"   // every secret it needs is set for the tenant
	AuthMissing = "missing" // some secret is set in none of the tenant's scopes
	AuthUnknown = "unknown" // no tenant was given
)

// AuthStatusJSON is a tool's auth status for a tenant: "ready" with the
// broadest scope its secrets come from (and a warning when that is the org
// scope), "missing", "none" or "unknown"; per secret, where it resolves.
// Secret values are never read: the recorder holds no master key.
type AuthStatusJSON struct {
	Status  string             `json:"status"`
	Scope   string             `json:"scope,omitempty"`
	Warning string             `json:"warning,omitempty"`
	Secrets []SecretStatusJSON `json:"secrets"`
}

// SecretStatusJSON is one secret of a tool: its name and the scope it
// resolves from, or "missing".
type SecretStatusJSON struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Scope  string `json:"scope,omitempty"`
}

// AdminToolsJSON is GET /v1/admin/tools.
type AdminToolsJSON struct {
	Tools []AdminToolJSON `json:"tools"`
}

// AdminToolJSON is a registry entry as the admin routes show it.
type AdminToolJSON struct {
	Ref string `json:"ref"`
	registry.Entry
}

// RegisterJSON is the answer to POST /v1/admin/tools.
type RegisterJSON struct {
	Ref     string `json:"ref"`
	Created bool   `json:"created"`
}

// StateJSON is the body of PUT /v1/admin/tools/{ref}/state.
type StateJSON struct {
	State registry.State `json:"state"`
}
