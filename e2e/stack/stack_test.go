package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
)

func startStack(t *testing.T, o stack.Options) *stack.Stack {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	st, err := stack.Start(t.Context(), o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	return st
}

func runToEnd(t *testing.T, st *stack.Stack, req envelope.RunRequest) *events.RunStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, req))
	final, err := st.Client.Follow(ctx, req.RunID, nil)
	require.NoError(t, err)
	require.NotNil(t, final)
	return final
}

func scripted(t *testing.T, runID string, tools []string, turns ...map[string]any) envelope.RunRequest {
	t.Helper()
	return orchestratortest.Scripted(t, runID, tools, envelope.Policy{}, turns...)
}

// lastEventData decodes into v the data of the last event stored on subject
// in stream; false when there is none.
func lastEventData(t *testing.T, js jetstream.JetStream, stream, subject string, v any) bool {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(t.Context(), subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	require.NoError(t, err)
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	require.NoError(t, err)
	require.NoError(t, events.DecodeData(ev, v))
	return true
}

func call(name string, args any) map[string]any {
	return map[string]any{"name": name, "arguments": args}
}

// TestDemoRunEndToEnd runs the demo through every service and the recorder on
// the real Postgres, and checks the outputs exactly.
func TestDemoRunEndToEnd(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	st := startStack(t, stack.Options{
		Recorder: recorder.ForStack(pgtest.Schema(t)), Tracer: tp,
		TracesURLTemplate: "http://traces.example/trace/{trace_id}",
	})

	req := demo.Request("demo-e2e-1")
	final := runToEnd(t, st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	out := final.Outputs
	require.NotNil(t, out)
	require.Equal(t, demo.Response, out.Response)

	// The call ids are the deterministic hashes of tool@version, input and seq.
	inputs := []struct{ name, input string }{
		{"echo", `{"text":"hello from toolwire"}`},
		{"calculator", `{"expression":"(2+3)*7"}`},
		{"get_current_time", `{"format":"iso8601","timezone":"UTC"}`},
		{"calculator", `{"expression":42}`},
	}
	var want []string
	for i, in := range inputs {
		id, err := envelope.CallID(in.name, "1.0.0", []byte(in.input), i+1)
		require.NoError(t, err)
		want = append(want, id)
	}
	require.Equal(t, want, out.ToolOrder)
	require.Len(t, out.ToolsByID, 4)

	echo := out.ToolsByID[want[0]]
	require.Nil(t, echo.Error)
	require.JSONEq(t, `{"text":"hello from toolwire"}`, string(echo.Output))
	require.JSONEq(t, inputs[0].input, string(echo.Input))
	calc := out.ToolsByID[want[1]]
	require.Nil(t, calc.Error)
	require.JSONEq(t, `{"result":35}`, string(calc.Output))
	clock := out.ToolsByID[want[2]]
	require.Nil(t, clock.Error)
	var tm struct {
		Time string `json:"time"`
	}
	require.NoError(t, json.Unmarshal(clock.Output, &tm))
	_, err := time.Parse(time.RFC3339Nano, tm.Time)
	require.NoError(t, err)

	bad := out.ToolsByID[want[3]]
	require.NotNil(t, bad.Error)
	require.Equal(t, envelope.CodeValidation, bad.Error.Code)
	require.Contains(t, bad.Error.Message, "calculator")
	require.NotEmpty(t, bad.Error.Details)
	require.Empty(t, bad.Output)

	for _, id := range want {
		env := out.ToolsByID[id]
		require.Equal(t, id, env.CallID)
		require.Equal(t, "1.0.0", env.Version)
		require.False(t, env.TEnd.Before(env.TStart))
	}
	require.NotNil(t, out.LastTool)
	require.Equal(t, want[2], out.LastTool.CallID, "last_tool is the last successful call")

	// (That calls of one turn run in parallel is TestParallelSleepsOverlap's
	// job: these three take microseconds, too short to overlap reliably.)

	// Pinned handles resolved beside the stable outputs.
	require.Contains(t, final.Pinned, "calc_result")
	require.NotNil(t, final.Pinned["calc_result"])
	require.Equal(t, want[1], final.Pinned["calc_result"].CallID)
	require.Contains(t, final.Pinned, "web_search_result")
	require.Nil(t, final.Pinned["web_search_result"])

	// The outputs match their contract schema.
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	b, err := json.Marshal(out)
	require.NoError(t, err)
	require.NoError(t, schemas.Validate(envelope.SchemaAgentOutputs, b))

	// One trace for the whole run, with the GenAI span names, and its URL.
	require.NotEmpty(t, final.TraceID)
	require.Equal(t, "http://traces.example/trace/"+final.TraceID, out.TracesURL)
	require.Eventually(t, func() bool { return countNames(spans.Ended())["execute_tool calculator"] >= 2 }, 5*time.Second, 20*time.Millisecond)
	names := countNames(spans.Ended())
	require.Equal(t, 1, names["invoke_agent demo-agent"])
	require.Equal(t, 3, names["chat scripted-demo"])
	require.Equal(t, 1, names["execute_tool echo"])
	for _, s := range spans.Ended() {
		if s.Name() == recorder.SpanWrite {
			continue // a trace of its own, linked to the run's (below)
		}
		require.Equal(t, final.TraceID, s.SpanContext().TraceID().String(), "span %q is in another trace", s.Name())
	}

	// A recorder transaction may hold several runs' events: it is a trace of
	// its own, linked to each run's.
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(spans.Ended(), func(s sdktrace.ReadOnlySpan) bool {
			return s.Name() == recorder.SpanWrite && slices.ContainsFunc(s.Links(), func(l sdktrace.Link) bool {
				return l.SpanContext.TraceID().String() == final.TraceID
			})
		})
	}, 10*time.Second, 25*time.Millisecond, "no recorder write linked to the run's trace")

	// The same run is in Postgres, served by the recorder's API.
	var recorded envelope.AgentOutputs
	require.Eventually(t, func() bool {
		code, body := get(t, st.HTTPURL+"/v1/runs/demo-e2e-1/outputs")
		return code == http.StatusOK && json.Unmarshal(body, &recorded) == nil
	}, 10*time.Second, 25*time.Millisecond)
	gotJSON, _ := json.Marshal(recorded)
	wantJSON, _ := json.Marshal(out)
	require.JSONEq(t, string(wantJSON), string(gotJSON))
	code, body := get(t, st.HTTPURL+"/v1/runs/demo-e2e-1")
	require.Equal(t, http.StatusOK, code)
	var run map[string]any
	require.NoError(t, json.Unmarshal(body, &run))
	require.Equal(t, "completed", run["status"])
}

// TestNoTestToolsByDefault: the stack (toolwire dev) registers the built-in
// tools, never the test tools failing and sleep, which a test or the bench
// gives it (Options.ExecutorOptions) when it needs them.
func TestNoTestToolsByDefault(t *testing.T) {
	st := startStack(t, stack.Options{})
	reg, err := registry.Open(t.Context(), st.JS)
	require.NoError(t, err)
	_, err = reg.Get(t.Context(), envelope.ToolRef{Name: "echo", Version: "1.0.0"})
	require.NoError(t, err)
	for _, name := range []string{"failing", "sleep"} {
		_, err = reg.Get(t.Context(), envelope.ToolRef{Name: name, Version: "1.0.0"})
		require.ErrorIs(t, err, registry.ErrNotFound, name)
	}
}

// TestParallelSleepsOverlap: four sleep calls of one turn run at the same time.
func TestParallelSleepsOverlap(t *testing.T) {
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(testtools.Sleep())}})
	args := map[string]any{"ms": 300}
	req := scripted(t, "sleeps-1", []string{"sleep@1.0.0"},
		map[string]any{"tool_calls": []any{call("sleep", args), call("sleep", args), call("sleep", args), call("sleep", args)}},
		map[string]any{"content": "rested"})
	final := runToEnd(t, st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Len(t, final.Outputs.ToolOrder, 4)
	var envs []envelope.ToolEnvelope
	for _, id := range final.Outputs.ToolOrder {
		env := final.Outputs.ToolsByID[id]
		require.Nil(t, env.Error)
		envs = append(envs, env)
	}
	require.True(t, overlapping(envs), "the four sleeps did not overlap: %v", intervals(envs))
}

func overlapping(envs []envelope.ToolEnvelope) bool {
	latestStart, earliestEnd := envs[0].TStart, envs[0].TEnd
	for _, e := range envs[1:] {
		if e.TStart.After(latestStart) {
			latestStart = e.TStart
		}
		if e.TEnd.Before(earliestEnd) {
			earliestEnd = e.TEnd
		}
	}
	return latestStart.Before(earliestEnd)
}

func intervals(envs []envelope.ToolEnvelope) []string {
	var out []string
	for _, e := range envs {
		out = append(out, fmt.Sprintf("[%s, %s]", e.TStart.Format("15:04:05.000000"), e.TEnd.Format("15:04:05.000000")))
	}
	return out
}

func countNames(spans []sdktrace.ReadOnlySpan) map[string]int {
	m := map[string]int{}
	for _, s := range spans {
		m[s.Name()]++
	}
	return m
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestRejections: bad input gets a clear error and nothing is lost.
func TestRejections(t *testing.T) {
	st := startStack(t, stack.Options{})
	ctx := t.Context()

	t.Run("unsafe run id is refused before any subject", func(t *testing.T) {
		for _, id := range []string{"", "a.b", "a*b", "a>", "has space", "x/../y"} {
			req := demo.Request("ok")
			req.RunID = id
			err := st.Client.Submit(ctx, req)
			require.ErrorIs(t, err, envelope.ErrInvalidRequest, "run id %q", id)
			require.ErrorContains(t, err, "run_id")
		}
		_, err := events.RunSubject("a.b", "requested")
		require.ErrorIs(t, err, events.ErrUnsafeID)
	})

	t.Run("malformed CloudEvent lands in the dead-letter stream", func(t *testing.T) {
		m := nats.NewMsg("toolwire.run.garbage-1.requested")
		m.Header.Set("ce-specversion", "1.0") // no id, source or type
		m.Data = []byte(`{"run_id":"garbage-1"}`)
		_, err := st.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		dl := waitDLQ(ctx, t, st.JS, "toolwire.dlq.TOOLWIRE_RUNS.orchestrator-runs")
		require.Equal(t, "toolwire.run.garbage-1.requested", dl.Headers().Get(consume.HeaderDLQSubject))
		require.Contains(t, dl.Headers().Get(consume.HeaderDLQError), "decode")
		require.Equal(t, m.Data, dl.Data(), "the dead letter keeps the original body")
	})

	t.Run("run request that fails its schema fails the run with the reason", func(t *testing.T) {
		e, err := events.Build(events.TypeRunRequested, "schema-bad-1/requested", "toolwire.run.schema-bad-1.requested",
			events.Attrs{Source: "/test", RunID: "schema-bad-1"},
			map[string]any{"run_id": "schema-bad-1", "tenant": map[string]any{"org_id": "o"}, "agent": map[string]any{"name": 7}})
		require.NoError(t, err)
		require.NoError(t, publish.NewPublisher(st.JS).Publish(ctx, e))
		final, err := st.Client.Wait(ctx, "schema-bad-1")
		require.ErrorIs(t, err, client.ErrRunFailed)
		require.Equal(t, events.StatusFailed, final.Status)
		require.Contains(t, final.Reason, "invalid run request")
		require.Contains(t, final.Reason, "/agent")
	})

	t.Run("structured-mode run request is accepted", func(t *testing.T) {
		req := scripted(t, "structured-1", []string{"echo@1.0.0"},
			map[string]any{"tool_calls": []any{call("echo", map[string]any{"text": "hi"})}},
			map[string]any{"content": "done"})
		out, err := events.NewRunRequested("/upstream", req, events.RunTrace{})
		require.NoError(t, err)
		m, err := events.EncodeStructured(out.Subject, &out.Event)
		require.NoError(t, err)
		_, err = st.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		final, err := st.Client.Wait(ctx, "structured-1")
		require.NoError(t, err)
		require.Equal(t, "done", final.Outputs.Response)
		require.Len(t, final.Outputs.ToolOrder, 1)
	})

	t.Run("unknown enabled tool fails the run up front", func(t *testing.T) {
		req := scripted(t, "unknown-enabled-1", []string{"nope@1.0.0"}, map[string]any{"content": "x"})
		require.NoError(t, st.Client.Submit(ctx, req))
		final, err := st.Client.Wait(ctx, req.RunID)
		require.ErrorIs(t, err, client.ErrRunFailed)
		require.Contains(t, final.Reason, "unknown tool nope@1.0.0")
	})

	t.Run("a call to a tool that is not enabled is POLICY_DENIED and the loop goes on", func(t *testing.T) {
		req := scripted(t, "not-enabled-1", []string{"echo@1.0.0"},
			map[string]any{"tool_calls": []any{call("calculator", map[string]any{"expression": "1+1"}), call("echo", map[string]any{"text": "a"})}},
			map[string]any{"content": "after the denial"})
		final := runToEnd(t, st, req)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		require.Equal(t, "after the denial", final.Outputs.Response)
		denied := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
		require.NotNil(t, denied.Error)
		require.Equal(t, envelope.CodePolicyDenied, denied.Error.Code)
		require.Contains(t, denied.Error.Message, "not enabled")
		require.Equal(t, final.Outputs.ToolOrder[1], final.Outputs.LastTool.CallID)
	})

	t.Run("max_iterations ends the run with a clear failure", func(t *testing.T) {
		loop := map[string]any{"tool_calls": []any{call("echo", map[string]any{"text": "again"})}}
		req := scripted(t, "iterations-1", []string{"echo@1.0.0"}, loop, loop, loop, loop)
		req.Agent.Policy.MaxIterations = 2
		final := runToEnd(t, st, req)
		require.Equal(t, events.StatusFailed, final.Status)
		require.Contains(t, final.Reason, "max_iterations")
	})

	t.Run("max_tool_calls denies the calls past the cap in a fan-out", func(t *testing.T) {
		var calls []any
		for i := range 5 {
			calls = append(calls, call("echo", map[string]any{"text": fmt.Sprint(i)}))
		}
		req := scripted(t, "fanout-cap-1", []string{"echo@1.0.0"}, map[string]any{"tool_calls": calls}, map[string]any{"content": "ok"})
		req.Agent.Policy.MaxToolCalls = 3
		final := runToEnd(t, st, req)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		var codes []string
		for _, id := range final.Outputs.ToolOrder {
			if e := final.Outputs.ToolsByID[id].Error; e != nil {
				codes = append(codes, string(e.Code))
			} else {
				codes = append(codes, "ok")
			}
		}
		require.Equal(t, []string{"ok", "ok", "ok", "POLICY_DENIED", "POLICY_DENIED"}, codes)
	})
}

func waitDLQ(ctx context.Context, t *testing.T, js jetstream.JetStream, subject string) jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamDLQ, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	require.NoError(t, err)
	m, err := cons.Next(jetstream.FetchMaxWait(15 * time.Second))
	require.NoError(t, err, "nothing reached %s", subject)
	return m
}

// TestRecorderExposure: the stack (toolwire dev) serves the recorder without
// configuration on loopback, refuses a non-loopback address without
// authentication, before starting anything, with the way to configure it,
// and serves it there with TOOLWIRE_AUTH=on or the loud opt-out.
func TestRecorderExposure(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	db := func() string { return "sqlite:" + filepath.Join(t.TempDir(), "recorder.db") }

	_, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir(), Recorder: recorder.ForStack(db()), HTTPListen: "0.0.0.0:0", Getenv: env(nil)})
	require.ErrorIs(t, err, recorder.ErrExposed)
	require.ErrorContains(t, err, "TOOLWIRE_AUTH=on")
	require.ErrorContains(t, err, "TOOLWIRE_INSECURE_NO_AUTH=1")

	for _, vars := range []map[string]string{nil, {recorder.EnvAuth: "on"}, {recorder.EnvInsecureNoAuth: "1"}} {
		listen := "0.0.0.0:0"
		if vars == nil {
			listen = "" // loopback by default
		}
		st := startStack(t, stack.Options{Recorder: recorder.ForStack(db()), HTTPListen: listen, Getenv: env(vars)})
		require.NotEmpty(t, st.HTTPURL, "%v", vars)
	}
}
