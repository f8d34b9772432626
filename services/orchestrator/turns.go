package orchestrator

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// awaiting reports whether the run waits for the verdict of iteration n.
func (s *RunState) awaiting(n int) bool {
	return s.Phase == PhaseAwaitingVerdict && s.Iteration == n
}

// fail ends the run with a reason (and an error code, when one applies).
func (s *RunState) fail(code envelope.ErrorCode, reason string) {
	s.Phase, s.Code, s.Reason, s.Claim = PhaseFailed, code, reason, nil
}

// applyTurn records the model's turn in the state: what it cost, and its tool
// calls with their sequence numbers, deterministic call ids and declared
// costs; a turn without tool calls ends the run.
func (s *Service) applyTurn(st *RunState, turn envelope.ModelTurn) error {
	resp := turn.Response
	// The arguments as the model wrote them are kept, made JSON when they
	// were not, so that the state always encodes.
	calls := make([]envelope.ToolCall, len(resp.ToolCalls))
	for i, tc := range resp.ToolCalls {
		tc.Arguments = validArguments(tc.Arguments)
		calls[i] = tc
	}
	if len(calls) == 0 {
		calls = nil
	}
	resp.ToolCalls = calls
	turn.Response = resp
	st.Turns = append(st.Turns, turn)
	st.Claim = nil

	m := turn.Model
	price, priced := s.cfg.Prices.For(m.Provider, m.Name)
	st.NextUsage++
	st.TurnUsage = append(st.TurnUsage, TurnUsage{
		Iteration: turn.Iteration, InputTokens: resp.Usage.InputTokens, OutputTokens: resp.Usage.OutputTokens,
		Cost: price.Cost(resp.Usage.InputTokens, resp.Usage.OutputTokens), Unpriced: !priced, UsageN: st.NextUsage,
	})
	defer st.recomputeSpend()

	st.Messages = append(st.Messages, envelope.Message{Role: envelope.RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls})
	if len(resp.ToolCalls) == 0 {
		st.Response = resp.Content
		s.finish(st)
		return nil
	}
	versions := map[string]string{}
	for _, ref := range mustRefs(st.Request.Agent) {
		versions[ref.Name] = ref.Version
	}
	seq := len(st.Calls)
	for _, tc := range resp.ToolCalls {
		seq++
		// Broken JSON from the model is a JSON string here: the tool's schema
		// rejects it and the model sees why.
		input := tc.Arguments
		name, valid := toolName(tc.Name)
		version := versions[name]
		if !valid {
			version = ""
		}
		id, err := envelope.CallID(name, version, input, seq)
		if err != nil {
			return fmt.Errorf("call id: %w", err)
		}
		c := CallState{
			Seq: seq, Iteration: st.Iteration, CallID: id, Name: name, Version: version,
			ProviderCallID: tc.ID, Input: input,
		}
		if valid && version != "" && s.catalog != nil {
			if e, ok := s.catalog.Lookup(envelope.ToolRef{Name: name, Version: version}); ok {
				c.Cost = e.Definition.Cost
			}
		}
		if !valid {
			// No tool can have this name: answer the call here, as the guard
			// would, so that the model sees why and the receipt stays valid.
			now := time.Now().UTC()
			c.Local = true
			c.Envelope = &envelope.ToolEnvelope{
				CallID: id, Name: name, Input: input, TStart: now, TEnd: now,
				Error: envelope.NewToolError(envelope.CodePolicyDenied,
					"the model called %q, which is not a valid tool name (letters, digits, '_' or '-', at most 64)", truncateName(tc.Name)),
			}
			st.NextUsage++
			c.UsageN = st.NextUsage
		}
		st.Calls = append(st.Calls, c)
	}
	st.Phase = PhaseAwaitingTools
	advanceIfTurnDone(st)
	return nil
}

// validArguments is the model's arguments as JSON: {} for none, the text as a
// JSON string when it is not JSON.
func validArguments(args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return json.RawMessage(`{}`)
	}
	if json.Valid(args) {
		return args
	}
	b, _ := json.Marshal(string(args))
	return b
}

var validToolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// toolName returns the name to record for a model's tool call, and whether it
// is a valid tool name; an invalid one is made safe for the receipt.
func toolName(raw string) (string, bool) {
	if validToolName.MatchString(raw) {
		return raw, true
	}
	b := []byte(truncateName(raw))
	for i, c := range b {
		if c != '_' && c != '-' && (c < '0' || c > '9') && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "invalid_tool_name", false
	}
	return string(b), false
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// billable reports whether a call's declared cost accrues to the spend: the
// tool ran (or may have: a timeout, a provider or network error) and its
// result did not come from the cache. A call refused by policy, rejected by
// validation, missing its secrets or rate limited never ran.
func billable(c *CallState, env *envelope.ToolEnvelope) bool {
	if c.Local || env.Cached {
		return false
	}
	if env.Error == nil {
		return true
	}
	switch env.Error.Code {
	case envelope.CodePolicyDenied, envelope.CodeValidation, envelope.CodeAuthRequired, envelope.CodeRateLimit:
		return false
	}
	return true
}

// advanceIfTurnDone moves the run to its next iteration once every call of
// the current turn has its envelope: the results join the conversation in the
// order the model made the calls.
func advanceIfTurnDone(st *RunState) {
	if st.Phase != PhaseAwaitingTools {
		return
	}
	calls := st.callsOf(st.Iteration)
	for _, c := range calls {
		if c.Envelope == nil {
			return
		}
	}
	for _, c := range calls {
		st.Messages = append(st.Messages, envelope.Message{
			Role: envelope.RoleTool, ToolCallID: c.ProviderCallID, Name: c.Name,
			Content: ToolResultContent(c.Envelope), IsError: c.Envelope.Error != nil,
		})
	}
	st.Iteration++
	st.Phase = PhaseAwaitingVerdict
}

// traceIDOf is the trace id of the run's traceparent, "" when it has none.
func traceIDOf(rt events.RunTrace) string {
	parts := strings.Split(rt.TraceParent, "-")
	if len(parts) != 4 {
		return ""
	}
	id, err := trace.TraceIDFromHex(parts[1])
	if err != nil || !id.IsValid() {
		return ""
	}
	return id.String()
}

// finish computes the run's outputs and pinned handles.
func (s *Service) finish(st *RunState) {
	out := envelope.NewAgentOutputs(st.Response, st.envelopes(), events.TracesURL(s.cfg.TracesURLTemplate, traceIDOf(st.Trace)))
	st.Outputs = &out
	pinned, err := envelope.ResolvePins(out, st.Request.Agent.PinnedHandles)
	st.Pinned = pinned
	if err != nil {
		st.fail("", err.Error())
		return
	}
	st.Phase = PhaseCompleted
}

// ToolResultContent is what the model sees of an envelope: the output JSON, or
// for a failure the error's code, message and retry hint (never its details
// when the code is UNKNOWN: internals stay in the logs).
func ToolResultContent(env *envelope.ToolEnvelope) string {
	if env.Error == nil {
		if len(env.Output) == 0 {
			return "null"
		}
		return string(env.Output)
	}
	e := map[string]any{"code": env.Error.Code, "message": env.Error.Message}
	if env.Error.RetryAfterS > 0 {
		e["retry_after_s"] = env.Error.RetryAfterS
	}
	if env.Error.Details != nil && env.Error.Code != envelope.CodeUnknown {
		e["details"] = env.Error.Details
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return string(b)
}
