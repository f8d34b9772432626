package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apiclient"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// runCLIUntil runs the toolwire command with args and cancels its context
// (as SIGINT does) once its standard error shows cancelOn; it returns its
// output. The command's own --timeout bounds it.
func runCLIUntil(t *testing.T, cancelOn string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	errOut := &cancelWriter{on: cancelOn, cancel: cancel}
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(strings.NewReader(""))
	root.SetOut(&out)
	root.SetErr(errOut)
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// cancelWriter keeps what is written and calls cancel once it holds on.
type cancelWriter struct {
	mu     sync.Mutex
	b      bytes.Buffer
	on     string
	cancel context.CancelFunc
}

func (w *cancelWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.b.Write(p)
	if strings.Contains(w.b.String(), w.on) {
		w.cancel()
	}
	return n, err
}

func (w *cancelWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// nowhere returns a NATS URL and a recorder URL where nothing listens.
func nowhere(t *testing.T) (natsURL, httpURL string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "nats://" + addr, "http://" + addr
}

// writeRequest writes req as a run request file and returns its path.
func writeRequest(t *testing.T, req envelope.RunRequest) string {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), req.RunID+".json")
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// TestRunsCommands: on a stack with the recorder (as `toolwire dev` runs
// it), runs list, get, outputs and follow read a completed run and a failed
// one; run prints a failed run's status JSON; run and runs follow that stop
// waiting (--timeout, an interrupt) say the run goes on and how to
// reattach; each error has its exit status.
func TestRunsCommands(t *testing.T) {
	dir := t.TempDir()
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(sqlite.URL(filepath.Join(dir, "recorder.db")))})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	rec := []string{"--recorder", st.HTTPURL}
	deadNATS, deadHTTP := nowhere(t)

	// A completed run, as `toolwire run` prints it.
	out, runErr, err := runCLI(t, "", "run", "--demo", "--run-id", "runs-ok", "--nats", st.URL)
	require.NoError(t, err, runErr)
	var outputs envelope.AgentOutputs
	require.NoError(t, json.Unmarshal([]byte(out), &outputs), out)
	require.Equal(t, demo.Response, outputs.Response)

	// A failed run: one model turn allowed, the demo asks for two.
	failing := demo.Request("runs-failed")
	failing.Agent.Policy.MaxIterations = 1
	out, errOut, err := runCLI(t, "", "run", "-f", writeRequest(t, failing), "--nats", st.URL)
	require.Error(t, err)
	require.Equal(t, exitRunFailed, exitCode(err), err.Error())
	require.ErrorContains(t, err, "run runs-failed failed")
	var status events.RunStatus
	require.NoError(t, json.Unmarshal([]byte(out), &status), "a failed run's status JSON on stdout: %s", out)
	require.Equal(t, events.StatusFailed, status.Status)
	require.Equal(t, "runs-failed", status.RunID)
	require.NotEmpty(t, status.Reason)
	require.Contains(t, errOut, "run runs-failed failed")

	// A run that waits for an operator's decision on echo: it does not end
	// while the tests below wait for it.
	waiting := demo.Request("runs-waiting")
	waiting.Agent.Policy.RequireApproval = &envelope.ApprovalPolicy{Tools: []string{"echo"}}
	waitingFile := writeRequest(t, waiting)

	for _, id := range []string{"runs-ok", "runs-failed"} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		_, err := apiclient.WaitSettled(ctx, st.HTTPURL, id, 20*time.Millisecond)
		cancel()
		require.NoError(t, err)
	}

	t.Run("follow a finished run prints what run printed", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "runs", "follow", "runs-ok", "--nats", st.URL)
		require.NoError(t, err, errOut)
		var again envelope.AgentOutputs
		require.NoError(t, json.Unmarshal([]byte(out), &again), out)
		require.Equal(t, outputs, again)
		// The same lines as toolwire run printed; a call's line comes after
		// its turn's, but live it may come before the next turn's (the
		// order client.Follow keeps: client/client.go).
		lines := func(s string) []string {
			l := strings.Split(strings.TrimSpace(s), "\n")
			slices.Sort(l)
			return l
		}
		require.Equal(t, lines(runErr), lines(errOut), "the same progress lines as toolwire run")
		require.True(t, strings.HasPrefix(errOut, "  model turn 1: 3 tool call(s)\n"), errOut)
		require.True(t, strings.HasSuffix(errOut, "run runs-ok completed \n"), errOut)
	})

	t.Run("follow a failed run prints its status", func(t *testing.T) {
		out, _, err := runCLI(t, "", "runs", "follow", "runs-failed", "--nats", st.URL)
		require.Equal(t, exitRunFailed, exitCode(err), "%v", err)
		var s events.RunStatus
		require.NoError(t, json.Unmarshal([]byte(out), &s), out)
		require.Equal(t, events.StatusFailed, s.Status)
	})

	t.Run("list", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want []string
		}{
			{"all", nil, []string{"runs-failed", "runs-ok"}},
			{"by status", []string{"--status", "completed"}, []string{"runs-ok"}},
			{"failed since an hour ago", []string{"--status", "failed", "--since", "1h"}, []string{"runs-failed"}},
			{"by agent and tenant", []string{"--agent", "demo-agent", "--tenant", "demo-org/demo-ws"}, []string{"runs-failed", "runs-ok"}},
			{"by org", []string{"--org", "demo-org", "--workspace", "demo-ws", "--user", "demo-user"}, []string{"runs-failed", "runs-ok"}},
			{"another org", []string{"--org", "acme"}, []string{}},
			{"until before them", []string{"--until", "2020-01-01T00:00:00Z"}, []string{}},
			{"limit", []string{"--limit", "1"}, []string{"runs-failed"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for _, format := range [][]string{{"--json"}, {"-o", "json"}} {
					args := append(append(append([]string{"runs", "list"}, rec...), tc.args...), format...)
					out, errOut, err := runCLI(t, "", args...)
					require.NoError(t, err, errOut)
					var runs []apitypes.RunJSON
					require.NoError(t, json.Unmarshal([]byte(out), &runs), out)
					ids := []string{}
					for _, r := range runs {
						ids = append(ids, r.RunID)
					}
					require.Equal(t, tc.want, ids, "newest first")
				}
			})
		}
		out, errOut, err := runCLI(t, "", append([]string{"runs", "list"}, rec...)...)
		require.NoError(t, err, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3, out)
		require.Regexp(t, `^RUN\s+STATUS\s+AGENT\s+TENANT\s+TURNS\s+CALLS\s+SPEND\s+CREATED\s+REASON$`, lines[0])
		require.Regexp(t, `^runs-ok\s+completed\s+demo-agent\s+demo-org/demo-ws/demo-user\s+3\s+4\s`, lines[2])
	})

	t.Run("get", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", append([]string{"runs", "get", "runs-ok"}, rec...)...)
		require.NoError(t, err, errOut)
		require.Contains(t, out, "run runs-ok: completed\n  agent demo-agent, tenant demo-org/demo-ws/demo-user")
		require.Contains(t, out, "3 model turn(s), 4 tool call(s)")
		require.Regexp(t, `\n  1\s+[0-9a-f]{12}\s+echo@1.0.0\s+completed`, out)

		out, errOut, err = runCLI(t, "", append([]string{"runs", "get", "runs-ok", "--json"}, rec...)...)
		require.NoError(t, err, errOut)
		var run apitypes.RunDetailJSON
		require.NoError(t, json.Unmarshal([]byte(out), &run), out)
		require.True(t, run.Settled)
		require.Len(t, run.ToolCalls, 4)
	})

	t.Run("outputs", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", append([]string{"runs", "outputs", "runs-ok"}, rec...)...)
		require.NoError(t, err, errOut)
		var got envelope.AgentOutputs
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.Equal(t, outputs.Response, got.Response)
		require.Equal(t, outputs.ToolOrder, got.ToolOrder)
	})

	t.Run("run past its timeout goes on", func(t *testing.T) {
		start := time.Now()
		_, errOut, err := runCLI(t, "", "run", "-f", waitingFile, "--nats", st.URL, "--timeout", "5s")
		require.Less(t, time.Since(start), 30*time.Second)
		require.Equal(t, exitTimeout, exitCode(err), "%v", err)
		require.ErrorContains(t, err, "run runs-waiting has not ended within --timeout 5s; it goes on: reattach with `toolwire runs follow runs-waiting --nats "+st.URL+"`")
		require.NotContains(t, err.Error(), "context deadline exceeded")
		require.Contains(t, errOut, "waits for an operator")
	})

	t.Run("follow past its timeout", func(t *testing.T) {
		_, errOut, err := runCLI(t, "", "runs", "follow", "runs-waiting", "--nats", st.URL, "--timeout", "5s")
		require.Equal(t, exitTimeout, exitCode(err), "%v", err)
		require.ErrorContains(t, err, "it goes on: reattach with `toolwire runs follow runs-waiting")
		require.Contains(t, errOut, "model turn 1: 3 tool call(s)")
		require.Contains(t, errOut, "decide with: toolwire approve runs-waiting")
	})

	t.Run("follow interrupted", func(t *testing.T) {
		_, _, err := runCLIUntil(t, "waits for an operator", "runs", "follow", "runs-waiting", "--nats", st.URL)
		require.Equal(t, exitInterrupted, exitCode(err), "%v", err)
		require.ErrorContains(t, err, "interrupted; run runs-waiting goes on: reattach with `toolwire runs follow runs-waiting")
		require.NotContains(t, err.Error(), "context canceled")
	})

	t.Run("outputs of a run that failed or goes on", func(t *testing.T) {
		_, _, err := runCLI(t, "", append([]string{"runs", "outputs", "runs-failed"}, rec...)...)
		require.Equal(t, exitRunFailed, exitCode(err), "%v", err)
		require.ErrorContains(t, err, `run "runs-failed" failed and has no outputs`)
		require.Eventually(t, func() bool {
			_, _, err = runCLI(t, "", append([]string{"runs", "outputs", "runs-waiting"}, rec...)...)
			return exitCode(err) == exitError
		}, 30*time.Second, 50*time.Millisecond, "%v", err)
		require.ErrorContains(t, err, `run "runs-waiting" is `)
	})

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			code int
			msg  string
		}{
			{"unknown flag", []string{"runs", "list", "--colour", "red"}, exitUsage, "unknown flag: --colour"},
			{"no run id", []string{"runs", "get"}, exitUsage, "accepts 1 arg(s), received 0"},
			{"two run ids", []string{"runs", "follow", "a", "b"}, exitUsage, "accepts 1 arg(s), received 2"},
			{"bad run id", []string{"runs", "outputs", "a.b"}, exitUsage, `run_id "a.b"`},
			{"bad since", append([]string{"runs", "list", "--since", "yesterday"}, rec...), exitUsage, "--since \"yesterday\": give an RFC 3339 time"},
			{"negative limit", append([]string{"runs", "list", "--limit", "-1"}, rec...), exitUsage, "--limit -1 must be at least 1"},
			{"bad output", []string{"runs", "list", "-o", "yaml"}, exitUsage, `-o "yaml": want json or table`},
			{"since after until", append([]string{"runs", "list", "--since", "2026-03-02T00:00:00Z", "--until", "2026-03-01T00:00:00Z"}, rec...),
				exitUsage, "must be before until"},
			{"bad status", append([]string{"runs", "list", "--status", "done"}, rec...), exitUsage, `status "done" is not one of`},
			{"unknown command", []string{"runz"}, exitUsage, `unknown command "runz"`},
			{"run without a request", []string{"run", "--nats", st.URL}, exitUsage, "give a run request with --file"},
			{"bad recorder URL", []string{"runs", "list", "--recorder", "localhost:8088"}, exitUsage, "want http(s)://host:port"},
			{"unknown run: get", append([]string{"runs", "get", "no-such-run"}, rec...), exitNotFound, `run "no-such-run" is not recorded`},
			{"unknown run: outputs", append([]string{"runs", "outputs", "no-such-run"}, rec...), exitNotFound, `run "no-such-run" is not recorded`},
			{"unknown run: follow", []string{"runs", "follow", "no-such-run", "--nats", st.URL}, exitNotFound,
				"run no-such-run: NATS holds no event of it"},
			{"no recorder: list", []string{"runs", "list", "--recorder", deadHTTP}, exitUnreachable, "no recorder at " + deadHTTP},
			{"no recorder: get", []string{"runs", "get", "runs-ok", "--recorder", deadHTTP}, exitUnreachable, "start it with `toolwire dev`"},
			{"no NATS: follow", []string{"runs", "follow", "runs-ok", "--nats", deadNATS, "--timeout", "1s"}, exitUnreachable, "no toolwire at " + deadNATS},
			{"no NATS: run", []string{"run", "--demo", "--nats", deadNATS, "--timeout", "1s"}, exitUnreachable, "no toolwire at " + deadNATS},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, _, err := runCLI(t, "", tc.args...)
				require.Error(t, err)
				require.Equal(t, tc.code, exitCode(err), err.Error())
				require.ErrorContains(t, err, tc.msg)
				require.Empty(t, out, "nothing on stdout")
			})
		}
	})
}

// TestRunInterrupted: `toolwire run` interrupted once its run is submitted
// says that the run goes on and how to reattach, and exits 130.
func TestRunInterrupted(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	waiting := demo.Request("interrupted-run")
	waiting.Agent.Policy.RequireApproval = &envelope.ApprovalPolicy{Tools: []string{"echo"}}
	_, errOut, err := runCLIUntil(t, "waits for an operator", "run", "-f", writeRequest(t, waiting), "--nats", st.URL)
	require.Equal(t, exitInterrupted, exitCode(err), "%v", err)
	require.EqualError(t, err, "interrupted; run interrupted-run goes on: reattach with `toolwire runs follow interrupted-run --nats "+st.URL+"`")
	require.Contains(t, errOut, "waits for an operator")
}

// TestRunsWithAuthentication: with the recorder's authentication on, runs
// list and get need a token (--token or TOOLWIRE_TOKEN), and a token of
// another org does not see the run: not found, as a run never recorded.
func TestRunsWithAuthentication(t *testing.T) {
	t.Setenv("TOOLWIRE_AUTH", "on")
	t.Setenv("TOOLWIRE_TOKEN", "")
	t.Setenv("DATABASE_URL", "")
	dir := t.TempDir()
	db := sqlite.URL(filepath.Join(dir, "recorder.db"))
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(db)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	token := func(org string) string {
		out, msg, err := runCLI(t, "", "tokens", "create", "--database-url", db, "--name", org, "--org", org, "--role", "viewer")
		require.NoError(t, err, msg)
		return strings.TrimSpace(out)
	}
	demoToken, acmeToken := token("demo-org"), token("acme")
	_, errOut, err := runCLI(t, "", "run", "--demo", "--run-id", "runs-auth", "--nats", st.URL)
	require.NoError(t, err, errOut)
	rec := []string{"--recorder", st.HTTPURL}

	_, _, err = runCLI(t, "", append([]string{"runs", "list"}, rec...)...)
	require.Equal(t, exitError, exitCode(err), "%v", err)
	require.ErrorContains(t, err, "authentication required")
	require.ErrorContains(t, err, "(401 unauthorized)")

	require.Eventually(t, func() bool {
		out, _, err := runCLI(t, "", append([]string{"runs", "get", "runs-auth", "--json", "--token", demoToken}, rec...)...)
		return err == nil && strings.Contains(out, `"settled": true`)
	}, 30*time.Second, 50*time.Millisecond)

	t.Setenv("TOOLWIRE_TOKEN", demoToken)
	out, errOut, err := runCLI(t, "", append([]string{"runs", "list", "--json"}, rec...)...)
	require.NoError(t, err, errOut)
	require.Contains(t, out, `"run_id": "runs-auth"`, "the token from TOOLWIRE_TOKEN")
	out, _, err = runCLI(t, "", "runs", "list", "--help")
	require.NoError(t, err)
	require.NotContains(t, out, demoToken, "--help never shows the token")

	_, _, err = runCLI(t, "", append([]string{"runs", "get", "runs-auth", "--token", acmeToken}, rec...)...)
	require.Equal(t, exitNotFound, exitCode(err), "%v", err)
	require.ErrorContains(t, err, `run "runs-auth" is not recorded`)
	out, errOut, err = runCLI(t, "", append([]string{"runs", "list", "--json", "--token", acmeToken}, rec...)...)
	require.NoError(t, err, errOut)
	require.JSONEq(t, "[]", out, "another org's runs do not show")
}

// TestFollowPrinter: the progress of a streaming model's run shows each
// model call on a thinking line, its text as it grows (on one line, without
// control characters), the tools it starts to call, a mark for an attempt
// discarded, and the call's turn ends the line; in JSON mode each delta and
// each event is a JSON line of its type.
func TestFollowPrinter(t *testing.T) {
	const runID = "printed"
	d := func(iteration, attempt, seq int) events.Delta {
		return events.Delta{RunID: runID, Iteration: iteration, Attempt: attempt, Seq: seq}
	}
	text := func(iteration, attempt, seq int, s string) client.Event {
		x := d(iteration, attempt, seq)
		x.Text = s
		return client.Event{Delta: &x}
	}
	tool := func(iteration, seq int, name, args string) client.Event {
		x := d(iteration, 1, seq)
		x.ToolCall = &events.DeltaToolCall{Name: name, Arguments: args}
		return client.Event{Delta: &x}
	}
	discarded := func(iteration, attempt, seq int) client.Event {
		x := d(iteration, attempt, seq)
		x.Discarded = true
		return client.Event{Delta: &x}
	}
	turnOut, err := events.NewTurnCompleted("/test", events.Turn{RunID: runID, Iteration: 1, Verdict: events.LoopVerdict{Allowed: true},
		Response: &envelope.ModelResponse{}}, events.RunTrace{})
	require.NoError(t, err)
	subj, err := events.ParseSubject(turnOut.Subject)
	require.NoError(t, err)
	turn := client.Event{Subject: subj, Event: &turnOut.Event}

	for _, tc := range []struct {
		name string
		evs  []client.Event
		want string
	}{
		{"text, then the turn", []client.Event{text(1, 1, 1, "Let me "), text(1, 1, 2, "look."), turn},
			"  thinking (turn 1): Let me look.\n  model turn 1: 0 tool call(s)\n"},
		{"tool calls by name", []client.Event{tool(1, 1, "echo", ""), tool(1, 2, "", `{"text":`), tool(1, 3, "calculator", ""), turn},
			"  thinking (turn 1): [calls echo] [calls calculator] \n  model turn 1: 0 tool call(s)\n"},
		{"a discarded attempt", []client.Event{text(1, 1, 1, "Hal"), discarded(1, 1, 2), text(1, 2, 3, "Hello"), turn},
			"  thinking (turn 1): Hal [attempt 1 discarded, retrying]\n  thinking (turn 1): Hello\n  model turn 1: 0 tool call(s)\n"},
		{"one line, no control characters", []client.Event{text(1, 1, 1, "two\nlines\tand \x1b[31mred\x1b[0m"), turn},
			"  thinking (turn 1): two lines and [31mred[0m\n  model turn 1: 0 tool call(s)\n"},
		{"a new model call starts a new line", []client.Event{text(1, 1, 1, "one"), text(2, 1, 1, "two")},
			"  thinking (turn 1): one\n  thinking (turn 2): two\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			p := newFollowPrinter(&out, false)
			for _, e := range tc.evs {
				require.True(t, p.print(e))
			}
			p.finish()
			require.Equal(t, tc.want, out.String())
		})
	}

	t.Run("json", func(t *testing.T) {
		var out bytes.Buffer
		p := newFollowPrinter(&out, true)
		for _, e := range []client.Event{text(1, 1, 1, "hi"), discarded(1, 1, 2), turn} {
			require.True(t, p.print(e))
		}
		p.finish()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 3)
		require.JSONEq(t, `{"type":"delta","run_id":"printed","iteration":1,"attempt":1,"seq":1,"text":"hi"}`, lines[0])
		require.JSONEq(t, `{"type":"delta","run_id":"printed","iteration":1,"attempt":1,"seq":2,"discarded":true}`, lines[1])
		var ev struct {
			Type  string `json:"type"`
			Event struct {
				Type  string `json:"type"`
				RunID string `json:"runid"`
				Data  struct {
					Iteration int `json:"iteration"`
				} `json:"data"`
			} `json:"event"`
		}
		require.NoError(t, json.Unmarshal([]byte(lines[2]), &ev))
		require.Equal(t, "event", ev.Type)
		require.Equal(t, events.TypeTurnCompleted, ev.Event.Type)
		require.Equal(t, runID, ev.Event.RunID)
		require.Equal(t, 1, ev.Event.Data.Iteration, "the event's data inline")
	})
}
