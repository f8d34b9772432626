package envelope

import "time"

// Usage counts the tokens of one model call.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// ModelResponse is one answer of the model in provider-neutral form: either tool
// calls, or final text, or both.
type ModelResponse struct {
	Content    string     `json:"content,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	StopReason string     `json:"stop_reason,omitempty"`
	Usage      Usage      `json:"usage"`
}

// ModelTurn records one model call of a run: what came back, and, in
// bundles of version 1, the whole conversation that was sent (version 2
// bundles leave Messages out: the conversation is rebuilt from the request,
// the turns and the envelopes, so a record never grows with its run).
type ModelTurn struct {
	Iteration int           `json:"iteration"`
	Model     Model         `json:"model"`
	Messages  []Message     `json:"messages,omitempty"`
	Tools     []string      `json:"tools"`
	Response  ModelResponse `json:"response"`
	TStart    time.Time     `json:"t_start"`
	TEnd      time.Time     `json:"t_end"`
}

// ReplayBundle is everything needed to replay a run deterministically
// (docs/architecture.md, Contracts; docs/recorder.md, Replay): the initial
// request (prompt and messages), the tool definitions as they were called,
// every model turn and every envelope in order; and how the run ended, with
// the Policy Guard's iteration verdicts, which a replay plays back too. The
// recorder serves it (GET /v1/runs/{run_id}/replay) and `toolwire replay`
// reads it: both need nothing but this type.
type ReplayBundle struct {
	// Version is the bundle's format: ReplayBundleVersion for a bundle
	// recorded by this contract; absent (0) for one recorded before it
	// (version 1), which replays the same way.
	Version   int              `json:"version,omitempty"`
	RunID     string           `json:"run_id"`
	Request   RunRequest       `json:"request"`
	Tools     []ToolDefinition `json:"tools"`
	Turns     []ModelTurn      `json:"turns"`
	Envelopes []ToolEnvelope   `json:"envelopes"`
	Outputs   *AgentOutputs    `json:"outputs,omitempty"`
	// Status is the run's status when the bundle was made (completed or
	// failed for a run that ended); a replay compares its outcome with it.
	Status string `json:"status,omitempty"`
	// Reason is why a failed run failed.
	Reason string `json:"reason,omitempty"`
	// Verdicts are the Policy Guard's answers to the run's iteration checks,
	// by iteration.
	Verdicts []IterationVerdict `json:"verdicts"`
}

// ReplayBundleVersion is the version of the bundles recorded by this
// build. Version 1 bundles (no version field) carry the messages of every
// turn; `toolwire replay` reads both and refuses a newer version by name.
const ReplayBundleVersion = 2

// IterationVerdict is the verdict of the loop rules on one iteration of a
// run: may the loop call the model again (in version 1 bundles, the Policy
// Guard's answer to the iteration check).
type IterationVerdict struct {
	Iteration int       `json:"iteration"`
	Allowed   bool      `json:"allowed"`
	Code      ErrorCode `json:"code,omitempty"`
	Reason    string    `json:"reason,omitempty"`
}
