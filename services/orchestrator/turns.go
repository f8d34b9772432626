package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// loopVerdict runs the loop rules (pkg/rules, the Policy Guard's own code)
// before model call n of a run: the iteration cap, and the budget with the
// least the call will cost (the previous call's tokens, which the prompt
// repeats, at the model's input price).
func (s *Service) loopVerdict(st *RunState, n int) events.LoopVerdict {
	minCost := 0.0
	if st.LastTokens > 0 {
		price, _ := s.cfg.Prices.For(st.Model.Provider, st.Model.Name)
		minCost = price.Cost(st.LastTokens, 0)
	}
	d := s.rules.CheckLoop(rules.Loop{Iteration: n, Policy: st.Policy, ToolCalls: st.Calls, Spend: st.Spend, MinCost: minCost})
	return events.LoopVerdict{Allowed: d.Allowed, Code: d.Code, Reason: d.Reason, Rule: d.Rule}
}

// advance moves a run whose current turn's calls are all answered on to its
// next model call, driven by trigger's handler, when the loop rules allow
// it, and ends it with the denial otherwise.
func (s *Service) advance(st *RunState, trigger string) {
	if st.Phase != PhaseAwaitingTools || !st.allDone() {
		return
	}
	if st.Cancel != nil {
		// Asked to stop: no model call follows the turn's last envelope.
		st.Trigger = trigger
		st.cancelled(st.Iteration)
		return
	}
	if c := st.stopCall(); c != "" {
		// A stop_at_tools call succeeded: its output is the answer.
		st.Trigger, st.StopCall, st.Phase = trigger, c, PhaseComplete
		return
	}
	n := st.Iteration + 1
	v := s.loopVerdict(st, n)
	st.Iteration, st.Trigger = n, trigger
	if !v.Allowed {
		st.Denied = &v
		st.fail(v.Code, fmt.Sprintf("policy denied iteration %d: %s", n, v.Reason))
		return
	}
	st.Phase = PhaseCalling
}

// deniedTurn is the record of a model call the loop rules refused: a turn
// without a response.
func deniedTurn(st *RunState) events.Turn {
	now := st.UpdatedAt
	if now.IsZero() {
		now = time.Now().UTC()
	}
	return events.Turn{
		RunID: st.RunID, Iteration: st.Iteration, Tenant: st.Tenant, Agent: st.Agent, Verdict: *st.Denied,
		Model: st.Model, TStart: now, TEnd: now, Policy: st.Policy, EnabledTools: st.EnabledTools, Spend: st.Spend,
	}
}

// callModel calls the model for turn n of the run with the conversation so
// far, and builds the turn it answers: its cost, and its tool calls numbered
// on from the run's last, with their deterministic ids, declared costs and
// queues. Calls no tool can take are answered here (Answered).
func (s *Service) callModel(ctx context.Context, st *RunState, req *envelope.RunRequest, msgs []envelope.Message,
	results []events.TurnResult) (*events.Turn, error) {
	n := st.Iteration
	prov, err := s.cfg.Providers.Get(req.Agent.Model.Provider)
	if err != nil {
		return nil, err
	}
	defs := map[string]*envelope.ToolDefinition{}
	tools := make([]envelope.ToolDefinition, 0, len(req.Agent.EnabledTools))
	names := make([]string, 0, len(req.Agent.EnabledTools))
	for _, ref := range mustRefs(req.Agent) {
		e, ok, err := s.catalog.Resolve(ctx, s.reg, ref)
		if err != nil {
			return nil, err
		}
		if ok && e.State.Executable() {
			tools = append(tools, e.Definition)
			names = append(names, ref.String())
			defs[ref.Name] = &tools[len(tools)-1]
		}
	}
	ctx, span := s.Tracer.Start(ctx, "chat "+req.Agent.Model.Name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.provider.name", req.Agent.Model.Provider),
			attribute.String("gen_ai.request.model", req.Agent.Model.Name),
			attribute.String("toolwire.run_id", st.RunID),
			attribute.Int("toolwire.iteration", n),
		))
	defer span.End()
	mctx, cancel := context.WithTimeout(ctx, s.cfg.ModelTimeout)
	defer cancel()
	start := time.Now()
	resp, err := s.complete(mctx, prov, req.Agent, provider.Request{
		RunID: st.RunID, Iteration: n, Model: req.Agent.Model, System: req.Agent.SystemPrompt,
		Messages: msgs, Tools: tools,
		ToolChoice: req.Agent.ToolChoiceAt(n), ParallelToolCalls: req.Agent.ParallelToolCalls, OutputSchema: req.Agent.OutputSchema,
	})
	end := time.Now()
	s.metrics.modelDur.Observe(end.Sub(start).Seconds())
	if err == nil && (resp.Usage.InputTokens < 0 || resp.Usage.OutputTokens < 0) {
		err = fmt.Errorf("%s model %s reported negative token counts", req.Agent.Model.Provider, req.Agent.Model.Name)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %s (%s): %w", s.cfg.ModelTimeout, EnvModelTimeout, err)
		}
		s.metrics.modelCalls.WithLabelValues(req.Agent.Model.Provider, "error").Inc()
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
		return nil, err
	}
	s.metrics.modelCalls.WithLabelValues(req.Agent.Model.Provider, "ok").Inc()
	span.SetAttributes(
		attribute.Int("gen_ai.usage.input_tokens", resp.Usage.InputTokens),
		attribute.Int("gen_ai.usage.output_tokens", resp.Usage.OutputTokens),
		attribute.StringSlice("gen_ai.response.finish_reasons", []string{resp.StopReason}),
	)

	m := req.Agent.Model
	price, priced := s.cfg.Prices.For(m.Provider, m.Name)
	cost := price.Cost(resp.Usage.InputTokens, resp.Usage.OutputTokens)
	t := &events.Turn{
		RunID: st.RunID, Iteration: n, Tenant: st.Tenant, Agent: st.Agent, Verdict: events.LoopVerdict{Allowed: true},
		Model: st.Model, Tools: names, Results: results, Cost: cost, Unpriced: !priced,
		TStart: start.UTC(), TEnd: end.UTC(), Policy: st.Policy, EnabledTools: st.EnabledTools, Spend: st.Spend + cost,
	}
	versions := map[string]string{}
	for _, ref := range mustRefs(req.Agent) {
		versions[ref.Name] = ref.Version
	}
	// The arguments as the model wrote them are kept, made JSON when they
	// were not, so that every record encodes.
	calls := make([]envelope.ToolCall, len(resp.ToolCalls))
	seq := st.Calls
	for i, tc := range resp.ToolCalls {
		tc.Arguments = validArguments(tc.Arguments)
		calls[i] = tc
		seq++
		t.Calls = append(t.Calls, s.turnCall(tc, seq, versions, defs))
	}
	if len(calls) == 0 {
		calls = nil
	} else if !st.Deadline.IsZero() {
		// The calls' guard and executors start none past it.
		d := st.Deadline.UTC()
		t.Deadline = &d
	}
	resp.ToolCalls = calls
	t.Response = &resp
	if len(calls) == 0 {
		if err := checkOutput(req.Agent, st, t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// checkOutput validates a final answer against the agent's output schema:
// accepted, its value is the turn's Output; refused, the turn is Rejected
// (the answer goes back to the model with the problems) while the agent's
// retries last, and an *outputError after.
func checkOutput(agent envelope.Agent, st *RunState, t *events.Turn) error {
	sch, err := agent.CompileOutputSchema()
	if err != nil || sch == nil {
		return err // validated with the request: never an error here
	}
	value, err := sch.Check(t.Response.Content)
	if err == nil {
		t.Output = value
		return nil
	}
	problems := []string{err.Error()}
	var se *envelope.SchemaError
	if errors.As(err, &se) {
		problems = se.Problems
	}
	if st.Rejections >= agent.OutputRetriesOr() {
		return &outputError{answers: st.Rejections + 1, problems: problems}
	}
	t.Rejected = &events.OutputRejection{Problems: problems, Attempt: st.Rejections + 1}
	return nil
}

// outputError is a final answer that failed the output schema with no retry
// left: the run fails with it.
type outputError struct {
	answers  int
	problems []string
}

func (e *outputError) Error() string {
	return fmt.Sprintf("the final answer failed agent.output_schema %d times (output_retries %d); the last answer: %s",
		e.answers, e.answers-1, strings.Join(e.problems, "; "))
}

// outputFeedback is what the model is told of a rejected answer.
func outputFeedback(r *events.OutputRejection) string {
	return "Your answer is not what the output schema asks for: " + strings.Join(r.Problems, "; ") +
		". Answer again with only one JSON value that the schema accepts."
}

// turnCall numbers one tool call of the model and gives it its id, cost and
// queue; a call no tool can take is marked Answered (answer gives its
// envelope).
func (s *Service) turnCall(tc envelope.ToolCall, seq int, versions map[string]string, defs map[string]*envelope.ToolDefinition) events.TurnCall {
	name, valid := toolName(tc.Name)
	version := versions[name]
	if !valid {
		version = ""
	}
	c := events.TurnCall{Seq: seq, Name: name, Version: version, Input: tc.Arguments, ProviderCallID: tc.ID,
		Queue: envelope.DefaultQueue}
	if def := defs[name]; def != nil && valid {
		c.Cost, c.Queue = def.Cost, def.QueueName()
	}
	id, err := envelope.CallID(name, version, tc.Arguments, seq)
	if err != nil {
		// Valid JSON that cannot be canonicalized (a number out of range, a
		// lone surrogate): no tool can be called with it, and no retry can
		// change that. Its id is taken over the arguments as a JSON string,
		// and the call is answered at once with VALIDATION_ERROR.
		asText, _ := json.Marshal(string(tc.Arguments))
		id, _ = envelope.CallID(name, version, asText, seq)
		c.Answered = true
	}
	c.CallID = id
	if !valid {
		c.Answered = true
	}
	return c
}

// answer is the envelope of a call the orchestrator answers itself: arguments
// no tool can take (VALIDATION_ERROR), or a name that is no tool's
// (POLICY_DENIED, as the guard would answer). It is built from the turn
// alone, so that publishing it again gives the same event.
func answer(t *events.Turn, c *events.TurnCall) envelope.ToolEnvelope {
	env := envelope.ToolEnvelope{CallID: c.CallID, Name: c.Name, Version: c.Version, Input: c.Input, TStart: t.TEnd, TEnd: t.TEnd}
	if _, err := envelope.Canonicalize(c.Input); err != nil {
		env.Error = envelope.NewToolError(envelope.CodeValidation,
			"the arguments of this call are JSON that no tool can take (%v): send numbers within the range of a double and strings of valid Unicode", err).
			WithDetails([]string{err.Error()})
		return env
	}
	called := c.Name
	if t.Response != nil {
		for _, tc := range t.Response.ToolCalls {
			if tc.ID == c.ProviderCallID && tc.ID != "" {
				called = truncateName(tc.Name)
			}
		}
	}
	env.Error = envelope.NewToolError(envelope.CodePolicyDenied,
		"the model called %q, which is not a valid tool name (letters, digits, '_' or '-', at most 64)", called)
	return env
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

func mustRefs(a envelope.Agent) []envelope.ToolRef {
	refs, _ := a.EnabledRefs() // validated before
	return refs
}
