package events

import "github.com/toolwire/toolwire/pkg/envelope"

// runStatusData is RunStatus as NewRunStatus encodes it, field for field, but
// for one type: its outputs have no MarshalJSON. segmentio's encoder parses
// and compacts again what a MarshalJSON method returns, and that was two
// thirds of the encoding of a completed run's event, on the run's critical
// path. dataOf sets the outputs' empty map and list as
// AgentOutputs.MarshalJSON does, so the bytes are those encoding/json writes
// for the RunStatus (TestRunStatusDataIsRunStatus, FuzzRunStatusData).
type runStatusData struct {
	RunID       string                            `json:"run_id"`
	Status      string                            `json:"status"`
	Agent       string                            `json:"agent,omitempty"`
	Tenant      envelope.Tenant                   `json:"tenant"`
	Reason      string                            `json:"reason,omitempty"`
	Warnings    []string                          `json:"warnings,omitempty"`
	Outputs     *plainOutputs                     `json:"outputs,omitempty"`
	Pinned      map[string]*envelope.ToolEnvelope `json:"pinned,omitempty"`
	OutputsBlob *envelope.Attachment              `json:"outputs_blob,omitempty"`
	TraceID     string                            `json:"trace_id,omitempty"`
	Iteration   int                               `json:"iteration,omitempty"`
	ToolCalls   int                               `json:"tool_calls,omitempty"`
	Spend       float64                           `json:"spend,omitempty"`
	Code        envelope.ErrorCode                `json:"code,omitempty"`
	Turn        *Turn                             `json:"turn,omitempty"`
}

// plainOutputs is envelope.AgentOutputs without its methods.
type plainOutputs envelope.AgentOutputs

// dataOf is s as runStatusData.
func (s *RunStatus) dataOf() runStatusData {
	d := runStatusData{
		RunID: s.RunID, Status: s.Status, Agent: s.Agent, Tenant: s.Tenant, Reason: s.Reason, Warnings: s.Warnings,
		Pinned: s.Pinned, OutputsBlob: s.OutputsBlob, TraceID: s.TraceID, Iteration: s.Iteration, ToolCalls: s.ToolCalls,
		Spend: s.Spend, Code: s.Code, Turn: s.Turn,
	}
	if s.Outputs != nil {
		o := plainOutputs(s.Outputs.WithCollections())
		d.Outputs = &o
	}
	return d
}
