package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// TestCallCommand: `toolwire call` runs one call as a run of its own (the
// Policy Guard judges it, the executor runs it, the recorder keeps it) and
// prints its envelope; a failing call is still an envelope
// (exit 0) unless --fail-on-error; bad arguments are refused before anything
// is sent.
func TestCallCommand(t *testing.T) {
	dir := t.TempDir()
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(sqlite.URL(filepath.Join(dir, "recorder.db"))),
		ExecutorOptions: []executor.Option{executor.WithTools(testtools.Failing())}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	decode := func(t *testing.T, out string) envelope.ToolEnvelope {
		t.Helper()
		var env envelope.ToolEnvelope
		require.NoError(t, json.Unmarshal([]byte(out), &env), out)
		return env
	}

	t.Run("success", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "call", "calculator@1.0.0", "--input", `{ "expression": "6*7" }`, "--nats", st.URL, "--org", "acme", "--user", "u1")
		require.NoError(t, err, errOut)
		env := decode(t, out)
		require.Nil(t, env.Error)
		require.JSONEq(t, `{"result":42}`, string(env.Output))
		id, err := envelope.CallID("calculator", "1.0.0", []byte(`{"expression":"6*7"}`), 1)
		require.NoError(t, err)
		require.Equal(t, id, env.CallID)
		require.Contains(t, errOut, "requested")
	})

	t.Run("input from standard input", func(t *testing.T) {
		out, errOut, err := runCLI(t, `{"text":"hi"}`, "call", "echo@1.0.0", "--input-file", "-", "--nats", st.URL)
		require.NoError(t, err, errOut)
		require.JSONEq(t, `{"text":"hi"}`, string(decode(t, out).Output))
	})

	t.Run("error envelope exits 0", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "call", "calculator@1.0.0", "--input", `{"expr":1}`, "--nats", st.URL)
		require.NoError(t, err, errOut)
		env := decode(t, out)
		require.NotNil(t, env.Error)
		require.Equal(t, envelope.CodeValidation, env.Error.Code)
	})

	t.Run("fail-on-error exits non-zero with the envelope printed", func(t *testing.T) {
		out, _, err := runCLI(t, "", "call", "failing@1.0.0", "--input", `{"message":"down"}`, "--nats", st.URL, "--fail-on-error")
		require.ErrorIs(t, err, errCallFailed)
		require.ErrorContains(t, err, "PROVIDER_ERROR: down")
		require.Equal(t, exitRunFailed, exitCode(err))
		require.Equal(t, envelope.CodeProviderError, decode(t, out).Error.Code)
	})

	t.Run("an unknown tool's run is refused with its reason", func(t *testing.T) {
		out, _, err := runCLI(t, "", "call", "nope@1.0.0", "--input", `{}`, "--nats", st.URL)
		require.ErrorContains(t, err, "unknown tool nope@1.0.0")
		require.Equal(t, exitRunFailed, exitCode(err), "the call's run failed")
		require.Empty(t, out)
	})

	t.Run("the Policy Guard judges the call", func(t *testing.T) {
		// The call's agent has the default policy: a blocked tool is refused
		// before its run starts, as any agent's.
		reg, err := registry.Open(t.Context(), st.JS)
		require.NoError(t, err)
		require.NoError(t, reg.SetState(t.Context(), envelope.ToolRef{Name: "failing", Version: "1.0.0"}, registry.StateBlocked))
		out, _, err := runCLI(t, "", "call", "failing@1.0.0", "--input", `{"message":"x"}`, "--nats", st.URL)
		require.ErrorContains(t, err, "tool failing@1.0.0 is blocked")
		require.Equal(t, exitRunFailed, exitCode(err), "the call's run failed")
		require.Empty(t, out)
	})

	t.Run("the call is recorded as a completed run", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "call", "echo@1.0.0", "--input", `{"text":"kept"}`, "--nats", st.URL, "--run-id", "call-recorded")
		require.NoError(t, err, errOut)
		require.JSONEq(t, `{"text":"kept"}`, string(decode(t, out).Output))
		require.Eventually(t, func() bool {
			resp, err := http.Get(st.HTTPURL + "/v1/runs/call-recorded")
			if err != nil {
				return false
			}
			defer func() { _ = resp.Body.Close() }()
			var run struct {
				Status string `json:"status"`
			}
			return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&run) == nil && run.Status == events.StatusCompleted
		}, 10*time.Second, 20*time.Millisecond)
	})

	t.Run("the agent loop acknowledges envelopes of calls outside its runs", func(t *testing.T) {
		// Every envelope above reached the orchestrator too: it must take them
		// (no run of its own) rather than retry them into the dead letters.
		eventstest.Drained(t, st.JS, events.StreamCalls, "orchestrator-calls", 10*time.Second)
		cons, err := st.JS.Consumer(t.Context(), events.StreamCalls, "orchestrator-calls")
		require.NoError(t, err)
		info, err := cons.Info(t.Context())
		require.NoError(t, err)
		require.Zero(t, info.NumRedelivered, "no envelope was retried")
		dlq, err := st.JS.Stream(t.Context(), events.StreamDLQ)
		require.NoError(t, err)
		dinfo, err := dlq.Info(t.Context())
		require.NoError(t, err)
		require.Zero(t, dinfo.State.Msgs, "nothing was dead-lettered")
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no version", []string{"call", "echo", "--input", `{}`}, "want name@version"},
		{"no input", []string{"call", "echo@1.0.0"}, "--input"},
		{"input not JSON", []string{"call", "echo@1.0.0", "--input", `{"text":`}, "input is not valid JSON"},
		{"both inputs", []string{"call", "echo@1.0.0", "--input", `{}`, "--input-file", "x.json"}, "not both"},
		{"unsafe run id", []string{"call", "echo@1.0.0", "--input", `{}`, "--run-id", "a.b"}, "run_id"},
		{"blank org", []string{"call", "echo@1.0.0", "--input", `{}`, "--org", " "}, "--org"},
		{"two tools", []string{"call", "echo@1.0.0", "calculator@1.0.0", "--input", `{}`}, "accepts 1 arg"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			out, _, err := runCLI(t, "", append(tc.args, "--nats", "nats://127.0.0.1:1")...)
			require.Error(t, err)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, exitUsage, exitCode(err), "refused before anything is sent")
			require.Empty(t, out)
		})
	}
}
