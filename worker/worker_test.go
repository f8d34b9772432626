package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker"
	"github.com/toolwire/toolwire/worker/workertest"
)

type upperIn struct {
	Text   string `json:"text" jsonschema:"the text to upper-case"`
	Repeat int    `json:"repeat,omitempty" jsonschema:"how many times; default once"`
}

type upperOut struct {
	Text string `json:"text"`
}

func upper(d worker.Def) *worker.Tool {
	if d.Name == "" {
		d.Name, d.Version, d.Description = "upper", "1.0.0", "Upper-cases a text."
	}
	if d.SideEffects == "" {
		d.SideEffects = worker.SideEffectsNone
	}
	return worker.Func(d, func(_ context.Context, in upperIn) (upperOut, error) {
		return upperOut{Text: strings.Repeat(strings.ToUpper(in.Text), max(in.Repeat, 1))}, nil
	})
}

// TestGeneratedSchemasValidateRealInputs: the schemas derived from the Go
// types, compiled as the executor compiles them, accept the inputs a model
// sends and refuse the others, each refusal naming the problem.
func TestGeneratedSchemasValidateRealInputs(t *testing.T) {
	def, err := upper(worker.Def{Queue: "text"}).Definition()
	require.NoError(t, err)
	require.Equal(t, "upper@1.0.0", def.Ref().String())
	require.Equal(t, "text", def.Queue)
	require.Equal(t, envelope.SideEffectsNone, def.Metadata.SideEffects)
	require.Equal(t, envelope.ImplBuiltin, def.Implementation.Kind)
	require.JSONEq(t, `{
		"$schema": "https://json-schema.org/draft/2020-12/schema",
		"type": "object",
		"properties": {
			"text": {"type": "string", "description": "the text to upper-case"},
			"repeat": {"type": "integer", "description": "how many times; default once"}
		},
		"required": ["text"],
		"additionalProperties": false
	}`, string(def.InputSchema))
	schemas, err := toolapi.CompileSchemas(&def)
	require.NoError(t, err)

	for _, c := range []struct {
		input   string
		problem string // "" when valid
	}{
		{`{"text":"hello"}`, ""},
		{`{"text":"hello","repeat":3}`, ""},
		{`{"text":""}`, ""},
		{`{}`, "text"},
		{`{"text":42}`, "string"},
		{`{"text":"a","repeat":1.5}`, "integer"},
		{`{"text":"a","shout":true}`, "shout"},
		{`[]`, "object"},
	} {
		err := envelope.ValidateAgainst("upper input", schemas.Input, []byte(c.input))
		if c.problem == "" {
			require.NoError(t, err, c.input)
			continue
		}
		var se *envelope.SchemaError
		require.ErrorAs(t, err, &se, c.input)
		require.NotEmpty(t, se.Problems)
		require.Contains(t, strings.Join(se.Problems, "; "), c.problem, c.input)
	}
	require.NoError(t, envelope.ValidateAgainst("upper output", schemas.Output, []byte(`{"text":"HELLO"}`)))
	require.Error(t, envelope.ValidateAgainst("upper output", schemas.Output, []byte(`{"txt":"HELLO"}`)))
}

// TestDeclarationsAreChecked: every declared field lands in the definition,
// and a bad declaration is an error that names the problem, before anything
// is registered or served.
func TestDeclarationsAreChecked(t *testing.T) {
	full := upper(worker.Def{
		Name: "send_mail", Version: "2.1.0", Description: "Sends a mail.",
		Category: worker.CategoryAPI, SideEffects: worker.SideEffectsWrites, Cost: 0.01,
		Timeout: 1500 * time.Millisecond, RateLimit: &worker.RateLimit{PerS: 2, Burst: 5},
		Secrets: []string{"smtp_password"}, Scopes: []string{"mail:send"}, Queue: "mail", Idempotent: true,
	})
	def, err := full.Definition()
	require.NoError(t, err)
	require.Equal(t, envelope.CategoryAPI, def.Metadata.Category)
	require.Equal(t, envelope.SideEffectsWrites, def.Metadata.SideEffects)
	require.Equal(t, envelope.CacheNone, def.Metadata.Cache)
	require.True(t, def.Metadata.Idempotent)
	require.True(t, def.RetriesWrites())
	require.Equal(t, 1500, def.TimeoutMS)
	require.InDelta(t, 0.01, def.Cost, 1e-12)
	require.Equal(t, []string{"smtp_password"}, def.RequiredSecrets)
	require.Equal(t, []string{"mail:send"}, def.RequiredScopes)
	require.Equal(t, &envelope.RateLimit{PerS: 2, Burst: 5}, def.RateLimit)
	cached, err := upper(worker.Def{Name: "c", Version: "1.0.0", Cache: worker.CacheTTL, CacheTTL: time.Minute}).Definition()
	require.NoError(t, err)
	require.Equal(t, 60, cached.Metadata.CacheTTLS)

	noop := func(context.Context, upperIn) (upperOut, error) { return upperOut{}, nil }
	for _, c := range []struct {
		name    string
		tool    *worker.Tool
		problem string
	}{
		{"no side effects", worker.Func(worker.Def{Name: "a", Version: "1.0.0"}, noop), "side effects must be declared"},
		{"bad name", upper(worker.Def{Name: "a b", Version: "1.0.0"}), "name must be"},
		{"bad version", upper(worker.Def{Name: "a", Version: "v1"}), "a@v1"},
		{"writes cached", upper(worker.Def{Name: "a", Version: "1.0.0", SideEffects: worker.SideEffectsWrites, Cache: worker.CacheForever}), "cannot be cached"},
		{"idempotent reads", upper(worker.Def{Name: "a", Version: "1.0.0", SideEffects: worker.SideEffectsReads, Idempotent: true}), "metadata.idempotent is only for a tool whose side_effects is writes"},
		{"ttl without seconds", upper(worker.Def{Name: "a", Version: "1.0.0", Cache: worker.CacheTTL}), "cache ttl"},
		{"ttl without ttl policy", upper(worker.Def{Name: "a", Version: "1.0.0", CacheTTL: time.Second}), "not ttl"},
		{"timeout in microseconds", upper(worker.Def{Name: "a", Version: "1.0.0", Timeout: time.Microsecond}), "whole milliseconds"},
		{"default queue", upper(worker.Def{Name: "a", Version: "1.0.0", Queue: "default"}), `queue "default" is the executor binary's`},
		{"bad queue", upper(worker.Def{Name: "a", Version: "1.0.0", Queue: "Text!"}), "queue"},
		{"bad secret name", upper(worker.Def{Name: "a", Version: "1.0.0", Secrets: []string{"a b"}}), "secret"},
		{"input not a struct", worker.Func(worker.Def{Name: "a", Version: "1.0.0", SideEffects: worker.SideEffectsNone},
			func(context.Context, string) (string, error) { return "", nil }), "want a struct"},
		{"input a channel", worker.Func(worker.Def{Name: "a", Version: "1.0.0", SideEffects: worker.SideEffectsNone},
			func(context.Context, struct{ C chan int }) (string, error) { return "", nil }), "input type"},
		{"no function", worker.Func[upperIn, upperOut](worker.Def{Name: "a", Version: "1.0.0", SideEffects: worker.SideEffectsNone}, nil), "no function"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.tool.Err()
			require.ErrorIs(t, err, worker.ErrInvalidTool)
			require.ErrorContains(t, err, c.problem)
		})
	}

	// A worker refuses tools without a queue, twice the same version, and
	// the default queue, naming each problem.
	for _, c := range []struct {
		name    string
		w       *worker.Worker
		problem string
	}{
		{"no queue", worker.New(worker.Config{}, upper(worker.Def{})), "names no queue"},
		{"twice", worker.New(worker.Config{Queue: "text"}, upper(worker.Def{}), upper(worker.Def{})), "given twice"},
		{"default queue", worker.New(worker.Config{Queue: "default"}, upper(worker.Def{})), `queue "default"`},
		{"no tools", worker.New(worker.Config{Queue: "text"}), "no tools"},
		{"bad tool", worker.New(worker.Config{Queue: "text"}, upper(worker.Def{Name: "x", Version: "1"})), "x@1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.w.Definitions()
			require.ErrorContains(t, err, c.problem)
			require.ErrorContains(t, c.w.Run(t.Context()), c.problem, "Run refuses before it connects")
		})
	}
}

// TestConflictingDefinitionIsRefused: a worker whose tool version is in the
// registry with another definition refuses to start, as `toolwire tools
// register` refuses, and leaves the registered definition as it was; the
// same definition registered again is accepted.
func TestConflictingDefinitionIsRefused(t *testing.T) {
	env, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Stop(context.Background())) })
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)

	first := worker.New(worker.Config{Queue: "text"}, upper(worker.Def{}))
	require.NoError(t, first.Start(t.Context(), env.JS))
	require.NoError(t, first.Stop(t.Context()))
	again := worker.New(worker.Config{Queue: "text"}, upper(worker.Def{}))
	require.NoError(t, again.Start(t.Context(), env.JS), "the same definition is accepted again")
	require.NoError(t, again.Stop(t.Context()))

	changed := worker.New(worker.Config{Queue: "text"}, upper(worker.Def{Name: "upper", Version: "1.0.0", Description: "Shouts a text."}))
	err = changed.Start(t.Context(), env.JS)
	require.ErrorIs(t, err, worker.ErrConflict)
	require.ErrorContains(t, err, "upper@1.0.0")
	require.NoError(t, changed.Stop(t.Context()), "a worker that did not start stops at once")
	e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "upper", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, "Upper-cases a text.", e.Definition.Description, "the registered definition is unchanged")

	// The same change as a new version is accepted.
	next := worker.New(worker.Config{Queue: "text"}, upper(worker.Def{Name: "upper", Version: "1.1.0", Description: "Shouts a text."}))
	require.NoError(t, next.Start(t.Context(), env.JS))
	require.NoError(t, next.Stop(t.Context()))
}

type failIn struct {
	Mode string `json:"mode" jsonschema:"ok, tool_error, wrapped, plain, panic or slow"`
}

type failOut struct {
	Mode string `json:"mode"`
}

// TestErrorsReachTheModelAsTheyShould runs a worker tool through the whole
// pipeline: an envelope-typed error keeps its code and message (wrapped or
// not); any other error is UNKNOWN without its text; a panic is a clean
// UNKNOWN and the worker serves the next call; a bad input is
// VALIDATION_ERROR with the problems in its details; a call past the
// tool's timeout is TIMEOUT.
func TestErrorsReachTheModelAsTheyShould(t *testing.T) {
	var calls atomic.Int64
	flaky := worker.Func(worker.Def{
		Name: "flaky", Version: "1.0.0", Description: "Fails as asked.",
		SideEffects: worker.SideEffectsNone, Timeout: 300 * time.Millisecond,
	}, func(ctx context.Context, in failIn) (failOut, error) {
		calls.Add(1)
		switch in.Mode {
		case "tool_error":
			return failOut{}, worker.Errorf(worker.CodeProviderError, "the mail server said no")
		case "wrapped":
			return failOut{}, fmt.Errorf("sending: %w", worker.Errorf(worker.CodeRateLimit, "slow down"))
		case "plain":
			return failOut{}, errors.New("dial tcp 10.1.2.3:25: password=hunter2 refused")
		case "panic":
			panic("index out of range in the secret sauce")
		case "slow":
			<-ctx.Done()
			return failOut{}, ctx.Err()
		}
		if got := worker.CallOf(ctx); got.CallID == "" || got.RunID == "" || got.TenantID == "" {
			return failOut{}, fmt.Errorf("no call in the context: %+v", got)
		} else if got.IdempotencyKey() != got.RunID+"."+got.CallID {
			return failOut{}, fmt.Errorf("idempotency key %q of call %+v", got.IdempotencyKey(), got)
		}
		return failOut{Mode: in.Mode}, nil
	})
	reg := prometheus.NewRegistry()
	env := workertest.Start(t, worker.Config{Queue: "faults", Metrics: reg}, flaky)

	res := env.Run(
		workertest.Calls(
			workertest.Call("flaky", failIn{Mode: "tool_error"}),
			workertest.Call("flaky", failIn{Mode: "wrapped"}),
			workertest.Call("flaky", failIn{Mode: "plain"}),
			workertest.Call("flaky", failIn{Mode: "panic"}),
			workertest.Call("flaky", failIn{Mode: "slow"}),
			workertest.Call("flaky", `{"mode":7,"extra":true}`),
		),
		workertest.Calls(workertest.Call("flaky", failIn{Mode: "ok"})),
		workertest.Answer("done"),
	)
	require.Equal(t, "completed", res.Status, res.Reason)
	envs := res.Envelopes("flaky")
	require.Len(t, envs, 7)
	byMode := map[string]envelope.ToolEnvelope{}
	for _, e := range envs {
		var in struct {
			Mode any `json:"mode"`
		}
		require.NoError(t, json.Unmarshal(e.Input, &in))
		byMode[fmt.Sprint(in.Mode)] = e
	}
	code := func(mode string) envelope.ErrorCode {
		e := byMode[mode]
		require.NotNil(t, e.Error, "%s: %s", mode, e.Output)
		return e.Error.Code
	}
	require.Equal(t, envelope.CodeProviderError, code("tool_error"))
	require.Equal(t, "the mail server said no", byMode["tool_error"].Error.Message)
	require.Equal(t, envelope.CodeRateLimit, code("wrapped"))
	require.Equal(t, "slow down", byMode["wrapped"].Error.Message)
	for _, mode := range []string{"plain", "panic"} {
		require.Equal(t, envelope.CodeUnknown, code(mode))
		msg, _ := json.Marshal(byMode[mode].Error)
		require.Equal(t, "internal error in tool flaky@1.0.0", byMode[mode].Error.Message)
		require.NotContains(t, string(msg), "hunter2")
		require.NotContains(t, string(msg), "secret sauce")
	}
	require.Equal(t, envelope.CodeTimeout, code("slow"))
	require.Equal(t, envelope.CodeValidation, code("7"))
	details, _ := json.Marshal(byMode["7"].Error.Details)
	require.Contains(t, string(details), "mode", "the details name the field")
	require.Contains(t, string(details), "extra")

	ok := byMode["ok"]
	require.Nil(t, ok.Error, "the worker serves after a panic")
	// The worker counts each call it ran by its final outcome, the plain
	// error and the panic as UNKNOWN; the invalid input never reached it.
	count := func(labels map[string]string) float64 {
		return servicetest.CounterSum(t, reg, "toolwire_worker_tool_calls_total", labels)
	}
	require.InDelta(t, 6, count(map[string]string{"tool": "flaky@1.0.0"}), 0)
	require.InDelta(t, 1, count(map[string]string{"tool": "flaky@1.0.0", "code": "ok"}), 0)
	require.InDelta(t, 2, count(map[string]string{"tool": "flaky@1.0.0", "code": "UNKNOWN"}), 0)
	require.JSONEq(t, `{"mode":"ok"}`, string(ok.Output))
	require.EqualValues(t, 6, calls.Load(), "the invalid input never reached the function")
}

// TestTheBuiltInsPipeline: a worker tool's calls go through the pipeline of
// the built-ins, with its spans, metrics and rate limits: the span of each
// call follows the GenAI conventions, the calls are counted by tool and
// outcome, and a call past the declared rate limit is RATE_LIMIT without
// running the function.
func TestTheBuiltInsPipeline(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reg := prometheus.NewRegistry()
	var runs atomic.Int64
	limited := worker.Func(worker.Def{
		Name: "limited", Version: "1.0.0", Description: "Upper-cases a text, once a day.",
		SideEffects: worker.SideEffectsReads, RateLimit: &worker.RateLimit{PerS: envelope.MinRateLimitPerS, Burst: 1},
	}, func(_ context.Context, in upperIn) (upperOut, error) {
		runs.Add(1)
		return upperOut{Text: strings.ToUpper(in.Text)}, nil
	})
	// The pipeline's spans are recorded too, so that the runs' traces are
	// sampled.
	env := workertest.StartWith(t, workertest.Options{Stack: stack.Options{Tracer: tp}},
		worker.Config{Queue: "limits", Tracer: tp, Metrics: reg}, limited)

	first := env.Call("limited", upperIn{Text: "a"})
	require.Nil(t, first.Error)
	second := env.Call("limited", upperIn{Text: "b"})
	require.NotNil(t, second.Error)
	require.Equal(t, envelope.CodeRateLimit, second.Error.Code)
	require.Positive(t, second.Error.RetryAfterS)
	require.EqualValues(t, 1, runs.Load())

	// A call's span ends once its completed event is published, which may
	// be after the run has read it.
	toolSpans := func() []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range spans.Ended() {
			if s.Name() == "execute_tool limited" {
				out = append(out, s)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(toolSpans()) == 2 }, 10*time.Second, 10*time.Millisecond, "one span per call")
	for _, s := range toolSpans() {
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		require.Equal(t, "limited", attrs["gen_ai.tool.name"])
		require.Equal(t, "1.0.0", attrs["toolwire.tool.version"])
		require.NotEmpty(t, attrs["gen_ai.tool.call.id"])
	}
	// The executor counts every call; the worker those it ran.
	pipeline := env.Stack.Metrics
	require.InDelta(t, 1, servicetest.CounterSum(t, pipeline, "toolwire_executor_tool_calls_total", map[string]string{"tool": "limited@1.0.0", "code": "ok"}), 0)
	require.InDelta(t, 1, servicetest.CounterSum(t, pipeline, "toolwire_executor_tool_calls_total", map[string]string{"tool": "limited@1.0.0", "code": "RATE_LIMIT"}), 0)
	require.InDelta(t, 1, servicetest.CounterSum(t, reg, "toolwire_worker_tool_calls_total", map[string]string{"tool": "limited@1.0.0", "code": "ok"}), 0)
	require.InDelta(t, 0, servicetest.CounterSum(t, reg, "toolwire_worker_tool_calls_total", map[string]string{"tool": "limited@1.0.0", "code": "RATE_LIMIT"}), 0,
		"the rate-limited call never reached the worker")
}

// TestPreviewHook: a worker tool with WithPreview declares supports_preview,
// and under a preview gate (a supervised node, a tool that writes) its call
// waits for an operator with what the preview function returned; approved,
// the tool itself runs, once.
func TestPreviewHook(t *testing.T) {
	type sendIn struct {
		To string `json:"to"`
	}
	type sendOut struct {
		Sent bool `json:"sent"`
	}
	var sent, previewed atomic.Int64
	send := worker.Func(worker.Def{Name: "send_note", Version: "1.0.0", Description: "Sends a note.", SideEffects: worker.SideEffectsWrites},
		func(_ context.Context, in sendIn) (sendOut, error) {
			sent.Add(1)
			return sendOut{Sent: true}, nil
		})
	send = worker.WithPreview(send, func(ctx context.Context, in sendIn) (any, error) {
		previewed.Add(1)
		if worker.CallOf(ctx).CallID == "" {
			return nil, errors.New("no call in the preview's context")
		}
		return map[string]any{"would_send_to": in.To}, nil
	})
	def, err := send.Definition()
	require.NoError(t, err)
	require.True(t, def.SupportsPreview)

	env := workertest.StartWith(t, workertest.Options{Policy: envelope.Policy{Autonomy: envelope.AutonomySupervised, ApprovalTimeoutS: 60}},
		worker.Config{Queue: "notes"}, send)
	required := make(chan *nats.Msg, 4)
	sub, err := env.Stack.JS.Conn().ChanSubscribe("toolwire.call.*.*.approval_required", required)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	done := make(chan *workertest.Result, 1)
	go func() {
		done <- env.Run(workertest.Calls(workertest.Call("send_note", sendIn{To: "ops@acme.example"})), workertest.Answer("done"))
	}()
	var ar events.ApprovalRequest
	select {
	case m := <-required:
		e, err := events.Decode(m)
		require.NoError(t, err)
		require.NoError(t, events.DecodeData(e, &ar))
	case <-time.After(30 * time.Second):
		t.Fatal("no approval request within 30s")
	}
	require.NotNil(t, ar.Gate)
	require.Equal(t, envelope.GatePreview, ar.Gate.Gate)
	require.NotNil(t, ar.Preview)
	require.Empty(t, ar.Preview.Unavailable)
	require.JSONEq(t, `{"would_send_to":"ops@acme.example"}`, string(ar.Preview.Output))
	require.Zero(t, sent.Load(), "the tool waits for the decision")

	out, err := events.NewDecided("/toolwire/cli", events.Decision{RunID: ar.RunID, CallID: ar.CorrelationID, Decision: events.DecisionApprove, By: "ops"},
		ar.Tenant, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.Stack.JS).Publish(t.Context(), out))
	var res *workertest.Result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the run did not end")
	}
	require.Equal(t, events.StatusCompleted, res.Status, res.Reason)
	require.Equal(t, int64(1), sent.Load())
	require.Equal(t, int64(1), previewed.Load())
}
