package envelope

import (
	"encoding/json"
	"time"

	fastjson "github.com/segmentio/encoding/json"
)

// AttachmentKind is the kind of a ToolEnvelope attachment.
type AttachmentKind string

// Attachment kinds (docs/architecture.md, Contracts: ToolEnvelope).
const (
	AttachmentBlob  AttachmentKind = "blob"
	AttachmentImage AttachmentKind = "image"
	AttachmentTable AttachmentKind = "table"
)

// Attachment is a rich attachment of a tool call, such as the blob holding an
// oversized output.
type Attachment struct {
	Kind        AttachmentKind `json:"kind"`
	URL         string         `json:"url"`
	ContentType string         `json:"content_type,omitempty"`
	Bytes       int64          `json:"bytes,omitempty"`
}

// ToolEnvelope is the receipt of a single tool call (docs/architecture.md,
// Contracts).
//
// Input and Output are kept as raw JSON so that the receipt carries exactly what
// the tool saw and returned. Output is absent when Error is set.
type ToolEnvelope struct {
	CallID      string          `json:"call_id"`
	Name        string          `json:"name"`
	Version     string          `json:"version"`
	Input       json.RawMessage `json:"input"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       *ToolError      `json:"error,omitempty"`
	TStart      time.Time       `json:"t_start"`
	TEnd        time.Time       `json:"t_end"`
	Cached      bool            `json:"cached,omitempty"`
	Truncated   bool            `json:"truncated,omitempty"`
	Attachments []Attachment    `json:"attachments,omitempty"`
	// Cost is what the call cost the run: its tool's declared cost when it
	// ran (or may have: a timeout, a provider or network error), zero when it
	// never ran (refused, invalid, rate limited, missing secrets) or came from
	// the cache. Billing reads it here; the model's cost is on the turn.
	Cost float64 `json:"cost,omitempty"`
	// Attempt is the run of the tool this envelope is the outcome of, when
	// it is not the first (absent: 1): a writes tool that declares
	// metadata.idempotent, whose executor (or worker) died during the call,
	// was run again with the same idempotency key.
	Attempt int `json:"attempt,omitempty"`
}

// Billable reports whether the call's tool ran, or may have (a timeout, a
// provider or network error), and its result did not come from the cache:
// such a call costs its tool's declared cost. A call refused by policy,
// rejected by validation, missing its secrets or rate limited never ran.
func (e *ToolEnvelope) Billable() bool {
	if e.Cached {
		return false
	}
	if e.Error == nil {
		return true
	}
	switch e.Error.Code {
	case CodePolicyDenied, CodeValidation, CodeAuthRequired, CodeRateLimit:
		return false
	}
	return true
}

// OK reports whether the call succeeded.
func (e *ToolEnvelope) OK() bool { return e != nil && e.Error == nil }

// Latency is the wall time of the call.
func (e *ToolEnvelope) Latency() time.Duration { return e.TEnd.Sub(e.TStart) }

// ToolRef returns "name@version".
func (e *ToolEnvelope) ToolRef() string { return e.Name + "@" + e.Version }

// AgentOutputs is the stable output contract of every agent node
// (docs/architecture.md, Contracts). Its shape never depends on node
// configuration.
type AgentOutputs struct {
	Response string `json:"response"`
	// Output is the final answer as a validated JSON value (the value
	// Agent.OutputSchema accepted, or the output of the Agent.StopAtTools
	// call that ended the run), null for any other node: always written,
	// so that the shape never depends on the configuration.
	Output    json.RawMessage         `json:"output"`
	ToolsByID map[string]ToolEnvelope `json:"tools_by_id"`
	ToolOrder []string                `json:"tool_order"`
	LastTool  *ToolEnvelope           `json:"last_tool,omitempty"`
	TracesURL string                  `json:"traces_url,omitempty"`
}

// NewAgentOutputs builds AgentOutputs from the final response and the envelopes
// in chronological order. LastTool is the last envelope without an error.
func NewAgentOutputs(response string, ordered []ToolEnvelope, tracesURL string) AgentOutputs {
	out := AgentOutputs{
		Response:  response,
		ToolsByID: make(map[string]ToolEnvelope, len(ordered)),
		ToolOrder: make([]string, 0, len(ordered)),
		TracesURL: tracesURL,
	}
	for i := range ordered {
		env := ordered[i]
		out.ToolsByID[env.CallID] = env
		out.ToolOrder = append(out.ToolOrder, env.CallID)
		if env.Error == nil {
			last := env
			out.LastTool = &last
		}
	}
	return out
}

// WithCollections returns o with ToolsByID and ToolOrder set, empty, where
// they are nil: the contract writes them as {} and [], never as null.
func (o AgentOutputs) WithCollections() AgentOutputs {
	if o.ToolsByID == nil {
		o.ToolsByID = map[string]ToolEnvelope{}
	}
	if o.ToolOrder == nil {
		o.ToolOrder = []string{}
	}
	return o
}

// MarshalJSON keeps tools_by_id and tool_order present (as {} and []) when empty,
// so consumers never see null where the contract promises a map or a list.
// It writes the bytes encoding/json writes (FuzzAgentOutputsJSON) with
// segmentio's encoder, at a fraction of the cost: a run's outputs are encoded
// on its end's critical path.
func (o AgentOutputs) MarshalJSON() ([]byte, error) {
	type plain AgentOutputs
	return fastjson.Marshal(plain(o.WithCollections()))
}
