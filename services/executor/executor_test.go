package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
)

func okOutput(context.Context, json.RawMessage) (json.RawMessage, error) {
	return json.RawMessage(`{"ok":true}`), nil
}

func TestExecutorEndToEnd(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)

	// StartedAfter negative: every call, however quick, announces itself
	// before its tool runs, so that every call.started can be checked.
	s := startExecutor(t, env, Config{Concurrency: 8, ID: "executor-e2e", StartedAfter: -1}, WithTools(
		newTestTool("panicky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			panic("secret-token-123 exploded")
		}),
		newTestTool("erroring", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, errors.New("dial tcp 10.0.0.1:5432: password=hunter2 rejected")
		}),
		newTestTool("bad_output", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"ok":"yes"}`), nil
		}),
		newTestTool("not_json", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"ok":`), nil
		}),
		newTestTool("rate_limited", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, fmt.Errorf("upstream: %w", &envelope.ToolError{Code: envelope.CodeRateLimit, Message: "slow down", RetryAfterS: 1.5})
		}),
	))

	// Entries written after the start: the executor finds them even before its
	// catalog's watch delivers them.
	putEntry(t, reg, testtools.Sleep().Definition(), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.TimeoutMS = "0.0.1-test", 50 // run by the sleep built-in
	})
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateBlocked, func(d *envelope.ToolDefinition) { d.Version = "0.9.0" })
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateDeprecated, func(d *envelope.ToolDefinition) { d.Version = "0.8.0" })
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Name, d.Implementation = "remote", envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"http://127.0.0.1:9/hook"}`)}
	})
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Name, d.Implementation = "ghost", toolapi.BuiltinImplementation("no_such_builtin")
	})

	const runID = "run-e2e"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	rt := events.RunTrace{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "vendor=1"}

	tests := []struct {
		name     string
		tool     string // name@version
		input    string
		wantOut  string
		wantCode envelope.ErrorCode
		wantMsg  string
		problems []string // in error.details
		hidden   []string // never in the completed event
		retry    float64
	}{
		{name: "echo", tool: "echo@1.0.0", input: "{ \"text\" : \"h\\u00e9llo  world\" }", wantOut: `{"text":"héllo  world"}`},
		{name: "deprecated still runs", tool: "echo@0.8.0", input: `{"text":"old"}`, wantOut: `{"text":"old"}`},
		{name: "calculator", tool: "calculator@1.0.0", input: `{"expression":"2*(3+4)^2"}`, wantOut: `{"result":98}`},
		{name: "get_current_time", tool: "get_current_time@1.0.0", input: `{"format":"unix","timezone":"UTC"}`},
		{name: "sleep", tool: "sleep@1.0.0", input: `{"ms":1}`, wantOut: `{"slept_ms":1}`},
		{
			name: "bad arguments", tool: "calculator@1.0.0", input: `{"expr":"1+1"}`,
			wantCode: envelope.CodeValidation, wantMsg: "input for tool calculator@1.0.0 does not match its input schema",
			problems: []string{"missing property 'expression'", "additional properties 'expr' not allowed"},
		},
		{name: "division by zero", tool: "calculator@1.0.0", input: `{"expression":"1/0"}`, wantCode: envelope.CodeValidation, wantMsg: "division by zero at position 2"},
		{name: "unknown timezone", tool: "get_current_time@1.0.0", input: `{"timezone":"Nowhere/Land"}`, wantCode: envelope.CodeValidation, wantMsg: "unknown timezone"},
		{name: "unknown tool", tool: "nope@1.0.0", input: `{}`, wantCode: envelope.CodeValidation, wantMsg: "unknown tool nope@1.0.0"},
		{name: "unknown version", tool: "echo@9.9.9", input: `{"text":"x"}`, wantCode: envelope.CodeValidation, wantMsg: "unknown tool echo@9.9.9"},
		{name: "blocked", tool: "echo@0.9.0", input: `{"text":"x"}`, wantCode: envelope.CodePolicyDenied, wantMsg: "echo@0.9.0 is blocked"},
		{name: "timeout", tool: "sleep@0.0.1-test", input: `{"ms":600000}`, wantCode: envelope.CodeTimeout, wantMsg: "tool sleep@0.0.1-test timed out after 50ms"},
		{name: "failing", tool: "failing@1.0.0", input: `{"message":"upstream said 503"}`, wantCode: envelope.CodeProviderError, wantMsg: "upstream said 503"},
		{name: "tool error keeps its code", tool: "rate_limited@1.0.0", input: `{}`, wantCode: envelope.CodeRateLimit, wantMsg: "slow down", retry: 1.5},
		{
			name: "panic", tool: "panicky@1.0.0", input: `{}`,
			wantCode: envelope.CodeUnknown, wantMsg: "internal error in tool panicky@1.0.0", hidden: []string{"secret-token-123"},
		},
		{
			name: "plain error", tool: "erroring@1.0.0", input: `{}`,
			wantCode: envelope.CodeUnknown, wantMsg: "internal error in tool erroring@1.0.0", hidden: []string{"hunter2", "10.0.0.1"},
		},
		{
			name: "output breaks its schema", tool: "bad_output@1.0.0", input: `{}`,
			wantCode: envelope.CodeProviderError, wantMsg: "output of tool bad_output@1.0.0 does not match its output schema",
			problems: []string{"at /ok"},
		},
		{name: "output not JSON", tool: "not_json@1.0.0", input: `{}`, wantCode: envelope.CodeProviderError, wantMsg: "not JSON"},
		{name: "http endpoint refused by the guard", tool: "remote@1.0.0", input: `{"text":"x"}`, wantCode: envelope.CodePolicyDenied, wantMsg: "remote@1.0.0: destination 127.0.0.1 is a loopback address: refused"},
		{name: "builtin missing", tool: "ghost@1.0.0", input: `{"text":"x"}`, wantCode: envelope.CodeUnknown, wantMsg: `builtin "no_such_builtin" is not available`},
	}

	reqs := make([]events.CallRequest, len(tests))
	outs := make([]events.Outgoing, len(tests))
	for i, tc := range tests {
		ref, err := envelope.ParseToolRef(tc.tool)
		require.NoError(t, err)
		reqs[i] = callRequest(t, runID, i+1, ref.Name, ref.Version, tc.input)
		outs[i] = approved(t, reqs[i], rt)
	}
	require.NoError(t, pub.PublishAll(t.Context(), outs))

	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := reqs[i]
			got := w.envelopeOf(t, schemas, req)
			require.Equal(t, req.CallID, got.CallID)
			require.Equal(t, req.Name, got.Name)
			require.Equal(t, req.Version, got.Version)
			var compact bytes.Buffer
			require.NoError(t, json.Compact(&compact, req.Input))
			require.Equal(t, compact.String(), string(got.Input), "input exactly as received")
			require.Equal(t, time.UTC, got.TStart.Location())
			require.False(t, got.TEnd.Before(got.TStart), "t_end %s before t_start %s", got.TEnd, got.TStart)

			ev := w.wait(t, completedSubject(t, req))
			require.Equal(t, DefaultSource, ev.Source())
			require.Equal(t, runID, events.Ext(ev, events.ExtRunID))
			require.Equal(t, req.CallID, events.Ext(ev, events.ExtCallID))
			require.Equal(t, req.Tenant.ID(), events.Ext(ev, events.ExtTenantID))
			require.Equal(t, rt, events.TraceOf(ev), "the run trace is carried on")
			for _, h := range tc.hidden {
				require.NotContains(t, string(ev.Data()), h)
			}

			startedSubj, err := events.CallSubject(runID, req.CallID, "started")
			require.NoError(t, err)
			sev := w.wait(t, startedSubj)
			require.NoError(t, schemas.Validate(events.SchemaCallStarted, sev.Data()))
			var started events.CallStarted
			require.NoError(t, events.DecodeData(sev, &started))
			require.Equal(t, "executor-e2e", started.Executor)
			require.True(t, started.TStart.Equal(got.TStart))
			require.Equal(t, rt, events.TraceOf(sev))

			if tc.wantCode == "" {
				require.Nil(t, got.Error, "error: %+v", got.Error)
				if tc.wantOut != "" {
					require.JSONEq(t, tc.wantOut, string(got.Output))
				}
				return
			}
			require.NotNil(t, got.Error)
			require.Empty(t, got.Output)
			require.Equal(t, tc.wantCode, got.Error.Code)
			require.Contains(t, got.Error.Message, tc.wantMsg)
			require.Equal(t, tc.retry, got.Error.RetryAfterS)
			if len(tc.problems) > 0 {
				problems := problemsOf(t, got.Error)
				for _, p := range tc.problems {
					require.Contains(t, problems, p)
				}
			}
		})
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), waitLimit)
	defer cancel()
	require.NoError(t, s.Stop(ctx))
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.calls.WithLabelValues("calculator@1.0.0", "ok")))
	require.Equal(t, 2.0, testutil.ToFloat64(s.metrics.calls.WithLabelValues("calculator@1.0.0", "VALIDATION_ERROR")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.calls.WithLabelValues("sleep@0.0.1-test", "TIMEOUT")))
	require.Equal(t, 2.0, testutil.ToFloat64(s.metrics.calls.WithLabelValues(unknownTool, "VALIDATION_ERROR")),
		"nope@1.0.0 and echo@9.9.9 are not in the registry")
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.calls.WithLabelValues("echo@0.9.0", "POLICY_DENIED")))
	require.Equal(t, 0.0, testutil.ToFloat64(s.metrics.inFlight))
	require.Equal(t, 16, testutil.CollectAndCount(s.metrics.duration), "one duration series per tool name@version")
}

// TestRedeliveryIsIdempotent: the same approved event published twice is one
// message; a redelivery after the completion is acknowledged without running
// the tool; a run that does repeat publishes no second completed event, nor
// a second started one (started at once here, so that each run has one).
func TestRedeliveryIsIdempotent(t *testing.T) {
	env := eventstest.Start(t)
	var runs atomic.Int32
	s := startExecutor(t, env, Config{StartedAfter: -1}, WithTools(newTestTool("counting", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		return okOutput(ctx, in)
	})))
	schemas := newEventSchemas(t)

	const runID = "run-redeliver"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	req := callRequest(t, runID, 1, "counting", "1.0.0", `{"n":1}`)
	out := approved(t, req, events.RunTrace{})
	require.NoError(t, pub.Publish(t.Context(), out))
	require.NoError(t, pub.Publish(t.Context(), out))

	got := w.envelopeOf(t, schemas, req)
	require.Nil(t, got.Error)
	require.Equal(t, uint64(1), count(t, env.JS, out.Subject), "the duplicate approval is dropped")
	require.Equal(t, int32(1), runs.Load())

	// Redelivered after the completion was stored (say the ack was lost).
	require.NoError(t, s.handle(t.Context(), &consume.Delivery{Event: &out.Event, Subject: out.Subject, Attempt: 2}))
	require.Equal(t, int32(1), runs.Load(), "not run again")

	// Run again anyway (say the completion's publish timed out after storing):
	// the completed event is a duplicate of the stored one.
	require.NoError(t, s.handle(t.Context(), &consume.Delivery{Event: &out.Event, Subject: out.Subject, Attempt: 1}))
	require.Equal(t, int32(2), runs.Load())

	started, err := events.CallSubject(runID, req.CallID, "started")
	require.NoError(t, err)
	require.Equal(t, uint64(1), count(t, env.JS, completedSubject(t, req)), "one completed event")
	require.Equal(t, uint64(1), count(t, env.JS, started), "one started event")
}

// TestCallsRunInParallel: four sleep(200ms) calls published together overlap
// in time.
func TestCallsRunInParallel(t *testing.T) {
	env := eventstest.Start(t)
	startExecutor(t, env, Config{Concurrency: 4})
	schemas := newEventSchemas(t)

	const runID = "run-parallel"
	w := watchRun(t, env.JS, runID)
	var reqs []events.CallRequest
	for i := range 4 {
		req := callRequest(t, runID, i+1, "sleep", "1.0.0", `{"ms":200}`)
		reqs = append(reqs, req)
	}
	publishAllApproved(t, env.JS, reqs)

	var latestStart, earliestEnd time.Time
	for _, req := range reqs {
		got := w.envelopeOf(t, schemas, req)
		require.Nil(t, got.Error)
		if got.TStart.After(latestStart) {
			latestStart = got.TStart
		}
		if earliestEnd.IsZero() || got.TEnd.Before(earliestEnd) {
			earliestEnd = got.TEnd
		}
	}
	require.True(t, latestStart.Before(earliestEnd),
		"every [t_start, t_end] intersects: last start %s, first end %s", latestStart, earliestEnd)
}

// TestReplicasShareTheConsumer: two executors on one durable consumer complete
// every call exactly once (each call's started event, published at once
// here, names the replica that ran it).
func TestReplicasShareTheConsumer(t *testing.T) {
	env := eventstest.Start(t)
	startExecutor(t, env, Config{ID: "replica-a", Concurrency: 2, StartedAfter: -1})
	startExecutor(t, env, Config{ID: "replica-b", Concurrency: 2, StartedAfter: -1})
	schemas := newEventSchemas(t)

	const runID = "run-replicas"
	w := watchRun(t, env.JS, runID)
	var reqs []events.CallRequest
	for i := range 20 {
		req := callRequest(t, runID, i+1, "echo", "1.0.0", fmt.Sprintf(`{"text":"call %d"}`, i))
		reqs = append(reqs, req)
	}
	publishAllApproved(t, env.JS, reqs)

	for i, req := range reqs {
		got := w.envelopeOf(t, schemas, req)
		require.JSONEq(t, fmt.Sprintf(`{"text":"call %d"}`, i), string(got.Output))
		startedSubj, err := events.CallSubject(runID, req.CallID, "started")
		require.NoError(t, err)
		var started events.CallStarted
		require.NoError(t, events.DecodeData(w.wait(t, startedSubj), &started))
		require.Contains(t, []string{"replica-a", "replica-b"}, started.Executor)
	}
	for _, req := range reqs {
		require.Equal(t, uint64(1), count(t, env.JS, completedSubject(t, req)))
	}
	require.Equal(t, map[string]string{Durable: "toolwire.call.*.*.approved.default"}, durableFilters(t, env.JS),
		"the replicas share one durable consumer, of the default queue")
}

// TestStopDrainsCallsInFlight: Stop returns only after the call in flight has
// completed and been acknowledged.
func TestStopDrainsCallsInFlight(t *testing.T) {
	env := eventstest.Start(t)
	entered := make(chan struct{})
	enteredOnce := sync.OnceFunc(func() { close(entered) })
	release := make(chan struct{})
	s := newExecutor(t, testDeps(t, env, nil), Config{}, WithTools(newTestTool("blocking", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		enteredOnce()
		<-release
		return okOutput(ctx, in)
	})))
	start(t, s)

	req := callRequest(t, "run-drain", 1, "blocking", "1.0.0", `{}`)
	publishApproved(t, publish.NewPublisher(env.JS), req)
	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatal("the call never started")
	}

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		stopped <- s.Stop(ctx)
	}()
	close(release)
	require.NoError(t, <-stopped)

	require.Equal(t, uint64(1), count(t, env.JS, completedSubject(t, req)), "completed before Stop returned")
	cons, err := env.JS.Consumer(t.Context(), events.StreamCalls, Durable)
	require.NoError(t, err)
	info, err := cons.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.NumAckPending, "acknowledged before Stop returned")
	require.Zero(t, info.NumPending)
	require.NoError(t, s.Stop(t.Context()), "Stop is idempotent")
}

// TestToolIgnoringItsContext: a tool that does not stop at its deadline is
// abandoned and the call still ends in TIMEOUT.
func TestToolIgnoringItsContext(t *testing.T) {
	env := eventstest.Start(t)
	release := make(chan struct{})
	stubborn := newTestTool("stubborn", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		<-release // ignores ctx
		return okOutput(ctx, in)
	})
	stubborn.def.TimeoutMS = 20
	s := newExecutor(t, testDeps(t, env, nil), Config{}, WithTools(stubborn))
	s.abandonAfter = 10 * time.Millisecond
	start(t, s)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
	t.Cleanup(func() { close(release) }) // runs first: lets the abandoned tool return

	schemas := newEventSchemas(t)
	w := watchRun(t, env.JS, "run-stubborn")
	req := callRequest(t, "run-stubborn", 1, "stubborn", "1.0.0", `{}`)
	publishApproved(t, publish.NewPublisher(env.JS), req)
	got := w.envelopeOf(t, schemas, req)
	require.NotNil(t, got.Error)
	require.Equal(t, envelope.CodeTimeout, got.Error.Code)
	require.Equal(t, "tool stubborn@1.0.0 timed out after 20ms", got.Error.Message)
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.abandoned))
}

// TestMalformedCallIsDeadLettered: an approved event whose data is not a
// CallRequest is not retried but moved to the dead-letter stream.
func TestMalformedCallIsDeadLettered(t *testing.T) {
	env := eventstest.Start(t)
	startExecutor(t, env, Config{})
	subj, err := events.ApprovedSubject("run-poison", "abc123", envelope.DefaultQueue)
	require.NoError(t, err)
	out, err := events.Build(events.TypeCallApproved, "run-poison/abc123/approved", subj,
		events.Attrs{Source: testSource, RunID: "run-poison", CallID: "abc123"}, map[string]any{"surprise": true})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(t.Context(), out))

	cons, err := env.JS.OrderedConsumer(t.Context(), events.StreamDLQ, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{consume.DLQSubject(events.StreamCalls, Durable)},
	})
	require.NoError(t, err)
	m, err := cons.Next(jetstream.FetchMaxWait(waitLimit))
	require.NoError(t, err)
	require.Equal(t, subj, m.Headers().Get(consume.HeaderDLQSubject))
	require.Equal(t, "1", m.Headers().Get(consume.HeaderDLQDeliveries), "not retried")
	require.Contains(t, m.Headers().Get(consume.HeaderDLQError), "surprise")
}

func TestLifecycle(t *testing.T) {
	env := eventstest.Start(t)

	t.Run("stop before start", func(t *testing.T) {
		s, err := New(testDeps(t, env, nil), Config{}.With(withStandard()))
		require.NoError(t, err)
		require.NoError(t, s.Stop(t.Context()))
		require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
	})
	t.Run("start twice, stop twice", func(t *testing.T) {
		s, err := New(testDeps(t, env, nil), Config{}.With(withStandard()))
		require.NoError(t, err)
		require.NoError(t, s.Start(t.Context()))
		require.ErrorIs(t, s.Start(t.Context()), service.ErrAlreadyStarted)
		require.NoError(t, s.Stop(t.Context()))
		require.NoError(t, s.Stop(t.Context()))
		require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
	})
	t.Run("start with an ended context", func(t *testing.T) {
		s, err := New(testDeps(t, env, nil), Config{}.With(withStandard()))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.Error(t, s.Start(ctx))
		require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
		require.NoError(t, s.Stop(t.Context()))
	})
	t.Run("built-ins are in the registry", func(t *testing.T) {
		s := startExecutor(t, env, Config{})
		reg := openRegistry(t, env.JS)
		for _, def := range s.Definitions() {
			e, err := reg.Get(t.Context(), def.Ref())
			require.NoError(t, err)
			require.Equal(t, registry.StateActive, e.State)
			require.JSONEq(t, string(def.InputSchema), string(e.Definition.InputSchema))
		}
		// An operator's state change survives a restart, and an unchanged
		// definition is not written again.
		require.NoError(t, reg.SetState(t.Context(), envelope.ToolRef{Name: "failing", Version: toolapi.BuiltinVersion}, registry.StateBlocked))
		kv, err := env.JS.KeyValue(t.Context(), provision.BucketTools)
		require.NoError(t, err)
		echoKey := registry.Key(envelope.ToolRef{Name: "echo", Version: toolapi.BuiltinVersion})
		before, err := kv.Get(t.Context(), echoKey)
		require.NoError(t, err)
		startExecutor(t, env, Config{})
		after, err := kv.Get(t.Context(), echoKey)
		require.NoError(t, err)
		require.Equal(t, before.Revision(), after.Revision())
		e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "failing", Version: toolapi.BuiltinVersion})
		require.NoError(t, err)
		require.Equal(t, registry.StateBlocked, e.State)
	})
}

func TestNewRejects(t *testing.T) {
	env := eventstest.Start(t)
	mk := func(name string, change func(*envelope.ToolDefinition)) toolapi.Tool {
		tt := newTestTool(name, okOutput)
		change(&tt.def)
		return tt
	}
	nop := func(*envelope.ToolDefinition) {}
	tests := []struct {
		name    string
		cfg     Config
		tools   []toolapi.Tool
		noJS    bool
		wantErr string
	}{
		{name: "bad config", cfg: Config{Concurrency: -1}, wantErr: "concurrency"},
		{name: "no JetStream", noJS: true, wantErr: "executor: Deps.JS is required"},
		{name: "two tools, one key", tools: []toolapi.Tool{mk("a", nop), mk("a", nop)}, wantErr: `two tools have the builtin key "test_a"`},
		{name: "a key of a built-in", tools: []toolapi.Tool{mk("b", func(d *envelope.ToolDefinition) { d.Implementation = toolapi.BuiltinImplementation("echo") })}, wantErr: `builtin key "echo"`},
		{name: "invalid definition", tools: []toolapi.Tool{mk("c", func(d *envelope.ToolDefinition) { d.Metadata.Category = "misc" })}, wantErr: "metadata.category"},
		{name: "not builtin", tools: []toolapi.Tool{mk("d", func(d *envelope.ToolDefinition) { d.Implementation.Kind = envelope.ImplMCP })}, wantErr: "not builtin"},
		{name: "schema does not compile", tools: []toolapi.Tool{mk("e", func(d *envelope.ToolDefinition) { d.InputSchema = json.RawMessage(`{"type":12}`) })}, wantErr: "tool schema"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testDeps(t, env, nil)
			if tc.noJS {
				d.JS = nil
			}
			_, err := New(d, tc.cfg.With(withStandard(), WithTools(tc.tools...)))
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func BenchmarkCallRoundTrip(b *testing.B) {
	env := eventstest.Start(b)
	startExecutor(b, env, Config{})
	pub := publish.NewPublisher(env.JS)
	const runID = "run-bench"
	w := watchRun(b, env.JS, runID)
	seq := 0
	for b.Loop() {
		seq++
		req := callRequest(b, runID, seq, "echo", "1.0.0", `{"text":"hi"}`)
		publishApproved(b, pub, req)
		w.wait(b, completedSubject(b, req))
	}
}

// A redelivery of a call whose completed event is stored (its ack was lost)
// is acknowledged without running the tool again and publishes nothing: no
// second completed event, and no call.started either, since the envelope
// carries the call's t_start. (Before contract v2 the redelivery published a
// call.started missing from the stream; a call now owes none once it has
// completed.)
func TestRedeliveryOfACompletedCallPublishesNothing(t *testing.T) {
	env := eventstest.Start(t)
	s := startExecutor(t, env, Config{ID: "executor-started"})
	pub := publish.NewPublisher(env.JS)
	req := callRequest(t, "run-started-missing", 1, "echo", "1.0.0", `{"x":1}`)
	tStart := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	completed, err := events.NewCallCompleted(testSource, req.RunID, envelope.ToolEnvelope{
		CallID: req.CallID, Name: req.Name, Version: req.Version, Input: req.Input,
		Output: json.RawMessage(`{"ok":true}`), TStart: tStart, TEnd: tStart.Add(time.Millisecond),
	}, req.Tenant, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish(t.Context(), completed))
	startedSubj, err := events.CallSubject(req.RunID, req.CallID, "started")
	require.NoError(t, err)

	in := approved(t, req, events.RunTrace{})
	for range 2 {
		require.NoError(t, s.handle(t.Context(), &consume.Delivery{Event: &in.Event, Subject: in.Subject, Attempt: 2}))
	}
	require.Zero(t, count(t, env.JS, startedSubj), "no call.started for a completed call")
	require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)), "the tool did not run again")
	require.Zero(t, testutil.ToFloat64(s.metrics.calls.WithLabelValues("echo@1.0.0", outcomeOK)), "nothing ran")
}

// A call quicker than StartedAfter publishes no call.started at all (its
// envelope carries t_start); a slower one publishes call.started while the
// tool still runs, once. With StartedAfter negative, started goes out before
// the tool runs, however quick it is, and is stored before completed.
func TestStartedOnlyForSlowCalls(t *testing.T) {
	env := eventstest.Start(t)
	run := func(t *testing.T, s *Service, req events.CallRequest) (startedSubj string, done chan error) {
		subj, err := events.CallSubject(req.RunID, req.CallID, "started")
		require.NoError(t, err)
		in := approved(t, req, events.RunTrace{})
		done = make(chan error, 1)
		go func() {
			done <- s.handle(t.Context(), &consume.Delivery{Event: &in.Event, Subject: in.Subject, Attempt: 1})
		}()
		return subj, done
	}

	t.Run("quick call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-quick", StartedAfter: 10 * time.Second})
		req := callRequest(t, "run-quick", 1, "echo", "1.0.0", `{"text":"hi"}`)
		subj, done := run(t, s, req)
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
		require.Zero(t, count(t, env.JS, subj), "a quick call publishes no call.started")
	})
	t.Run("quick calls store two events each", func(t *testing.T) {
		startExecutor(t, env, Config{ID: "executor-quick-many", StartedAfter: maxStartedAfter})
		const runID = "run-quick-many"
		w := watchRun(t, env.JS, runID)
		schemas := newEventSchemas(t)
		var reqs []events.CallRequest
		for i := range 8 {
			reqs = append(reqs, callRequest(t, runID, i+1, "calculator", "1.0.0", `{"expression":"1+1"}`))
		}
		publishAllApproved(t, env.JS, reqs)
		for _, req := range reqs {
			got := w.envelopeOf(t, schemas, req)
			require.Nil(t, got.Error)
			require.False(t, got.TStart.IsZero(), "the envelope carries t_start")
		}
		filter, err := events.CallEvents(runID)
		require.NoError(t, err)
		st, err := env.JS.Stream(t.Context(), events.StreamCalls)
		require.NoError(t, err)
		info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(filter))
		require.NoError(t, err)
		stored := map[string]uint64{}
		for subj, n := range info.State.Subjects {
			p, err := events.ParseSubject(subj)
			require.NoError(t, err)
			stored[string(p.Verb)] += n
		}
		require.Equal(t, map[string]uint64{"approved": 8, "completed": 8}, stored, "two stored events per quick call: approved and completed")
	})
	t.Run("slow call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-slow", StartedAfter: 10 * time.Millisecond})
		req := callRequest(t, "run-slow", 1, "sleep", "1.0.0", `{"ms":2000}`)
		subj, done := run(t, s, req)
		require.Eventually(t, func() bool { return count(t, env.JS, subj) == 1 }, waitLimit, 5*time.Millisecond,
			"call.started is published while the tool runs")
		require.Zero(t, count(t, env.JS, completedSubject(t, req)), "the tool is still running")
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
		require.EqualValues(t, 1, count(t, env.JS, subj), "started is published once")
		require.Less(t, streamSeq(t, env.JS, subj), streamSeq(t, env.JS, completedSubject(t, req)))
	})
	t.Run("at once", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-at-once", StartedAfter: -1})
		req := callRequest(t, "run-at-once", 1, "sleep", "1.0.0", `{"ms":2000}`)
		subj, done := run(t, s, req)
		require.Eventually(t, func() bool { return count(t, env.JS, subj) == 1 }, waitLimit, 5*time.Millisecond)
		require.Zero(t, count(t, env.JS, completedSubject(t, req)))
		require.NoError(t, <-done)
	})
	t.Run("at once, quick call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-at-once-quick", StartedAfter: -1})
		req := callRequest(t, "run-at-once-quick", 1, "echo", "1.0.0", `{"text":"hi"}`)
		subj, done := run(t, s, req)
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, subj))
		require.Less(t, streamSeq(t, env.JS, subj), streamSeq(t, env.JS, completedSubject(t, req)), "started is stored before completed")
	})
}

// TestOutlivesItsStartContext: the service binary starts the executor with a
// start-up context that service.Run ends (60s after start, or here, at
// once). The registry watch, the consumer and the preview server live on:
// a registry change reaches the catalog, calls are still consumed, and
// previews are still answered.
func TestOutlivesItsStartContext(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	s := startExecutor(t, env, Config{ID: "executor-life"}) // its start context has ended
	reg := openRegistry(t, env.JS)

	const runID = "run-life"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	first := callRequest(t, runID, 1, "echo", "1.0.0", `{"text":"before"}`)
	publishApproved(t, pub, first)
	e := w.envelopeOf(t, schemas, first)
	require.Nil(t, e.Error)

	// A registry change after the start: the watch delivers it to the
	// catalog, and the next call meets it.
	ref := envelope.ToolRef{Name: "echo", Version: "1.0.0"}
	require.NoError(t, reg.SetState(t.Context(), ref, registry.StateBlocked))
	require.Eventually(t, func() bool {
		entry, ok := s.catalog.Lookup(ref)
		return ok && entry.State == registry.StateBlocked
	}, waitLimit, 5*time.Millisecond, "the catalog's watch follows the registry")
	second := callRequest(t, runID, 2, "echo", "1.0.0", `{"text":"after"}`)
	publishApproved(t, pub, second)
	e = w.envelopeOf(t, schemas, second)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodePolicyDenied, e.Error.Code)

	// The preview server answers.
	b, err := json.Marshal(callRequest(t, runID, 3, "calculator", "1.0.0", `{"expression":"1"}`))
	require.NoError(t, err)
	resp, err := env.Connect(t).RequestWithContext(t.Context(), events.SubjectPreview, b)
	require.NoError(t, err)
	var p events.ApprovalPreview
	require.NoError(t, json.Unmarshal(resp.Data, &p))
	require.Equal(t, "preview unavailable: tool calculator@1.0.0 does not declare supports_preview", p.Unavailable)
}

// TestFailedStartReleases: a Start that fails after it started the registry
// watch and the MCP pool releases them (no goroutine is left), and the
// service is stopped.
func TestFailedStartReleases(t *testing.T) {
	env := eventstest.Start(t)
	require.NoError(t, env.JS.DeleteKeyValue(t.Context(), provision.BucketOutcomes))
	d := testDeps(t, env, nil)
	s := newExecutor(t, d, Config{})
	// The connection's request multiplexer (one subscription for all its
	// requests, for its whole life) is not the executor's.
	_, err := d.JS.AccountInfo(t.Context())
	require.NoError(t, err)
	before := goleak.IgnoreCurrent()
	err = s.Start(t.Context())
	require.ErrorContains(t, err, "kv "+provision.BucketOutcomes)
	goleak.VerifyNone(t, before)
	require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
	require.NoError(t, s.Stop(t.Context()))
}

// TestQueuesRouteCalls: an executor serving the default queue and another
// serving "gpu" each run only the calls approved to their queue, through one
// durable consumer per queue filtered by the queue's subject. A call approved
// to a queue whose executor lacks the tool's implementation is answered with
// a clear error envelope.
func TestQueuesRouteCalls(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)
	// Started at once: each call's started event names the executor that
	// ran it.
	startExecutor(t, env, Config{ID: "ex-default", StartedAfter: -1}, WithTools(newTestTool("only_here", okOutput)))
	gpu := startExecutor(t, env, Config{ID: "ex-gpu", StartedAfter: -1}, WithQueues("gpu"))
	require.Equal(t, []string{"gpu"}, gpu.Config().Queues)
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Name, d.Queue = "gpu_echo", "gpu" // run by the echo built-in, on the gpu queue
	})

	const runID = "run-queues"
	w := watchRun(t, env.JS, runID)
	type call struct {
		req      events.CallRequest
		executor string
	}
	var calls []call
	var reqs []events.CallRequest
	for i := range 10 {
		req := callRequest(t, runID, i+1, "echo", "1.0.0", fmt.Sprintf(`{"text":"default %d"}`, i))
		want := "ex-default"
		if i%2 == 1 {
			req = callRequest(t, runID, i+1, "gpu_echo", "1.0.0", fmt.Sprintf(`{"text":"gpu %d"}`, i))
			req.Queue, want = "gpu", "ex-gpu"
		}
		calls = append(calls, call{req, want})
		reqs = append(reqs, req)
	}
	lost := callRequest(t, runID, 11, "only_here", "1.0.0", `{}`)
	lost.Queue = "gpu"
	calls = append(calls, call{lost, "ex-gpu"})
	publishAllApproved(t, env.JS, append(reqs, lost))

	for _, c := range calls {
		got := w.envelopeOf(t, schemas, c.req)
		require.Equal(t, c.executor, w.executorOf(t, c.req), "%s on queue %s", c.req.Ref(), c.req.Queue)
		if c.req.Name == "only_here" {
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeUnknown, got.Error.Code)
			require.Contains(t, got.Error.Message, `builtin "test_only_here" is not available`)
			continue
		}
		require.Nil(t, got.Error, "%+v", got.Error)
		require.JSONEq(t, string(c.req.Input), string(got.Output))
	}

	require.Equal(t, map[string]string{
		"executor":     "toolwire.call.*.*.approved.default",
		"executor-gpu": "toolwire.call.*.*.approved.gpu",
	}, durableFilters(t, env.JS), "one durable consumer per queue, filtered to it")
	require.Equal(t, Durable, DurableFor(envelope.DefaultQueue))
	require.Equal(t, "executor-gpu", DurableFor("gpu"))
}

// TestReplicasOfSeveralQueues: replicas that serve several queues share each
// queue's consumer, and every call of every queue completes once.
func TestReplicasOfSeveralQueues(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	for _, id := range []string{"multi-a", "multi-b"} {
		startExecutor(t, env, Config{ID: id, Concurrency: 2}, WithQueues("default", "batch"))
	}
	const runID = "run-multi"
	w := watchRun(t, env.JS, runID)
	var reqs []events.CallRequest
	for i := range 12 {
		req := callRequest(t, runID, i+1, "calculator", "1.0.0", fmt.Sprintf(`{"expression":"%d+1"}`, i))
		if i%3 == 0 {
			req.Queue = "batch"
		}
		reqs = append(reqs, req)
	}
	publishAllApproved(t, env.JS, reqs)
	for i, req := range reqs {
		got := w.envelopeOf(t, schemas, req)
		require.Nil(t, got.Error)
		require.JSONEq(t, fmt.Sprintf(`{"result":%d}`, i+1), string(got.Output))
	}
	for _, req := range reqs {
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
	}
	require.Equal(t, map[string]string{
		"executor":       "toolwire.call.*.*.approved.default",
		"executor-batch": "toolwire.call.*.*.approved.batch",
	}, durableFilters(t, env.JS), "the replicas share one consumer per queue")
}
