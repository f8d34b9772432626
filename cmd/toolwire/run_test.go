package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
)

func TestBuildRunRequest(t *testing.T) {
	now := time.Unix(1700000000, 42)
	file := filepath.Join(t.TempDir(), "req.json")
	fromFile := demo.Request("from-file")
	temp := 0.3
	fromFile.Agent.Model = envelope.Model{Provider: "anthropic", Name: "claude-haiku-4-5", Temperature: &temp}
	b, err := json.Marshal(fromFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, b, 0o600))
	n := 0
	write := func(content string) string {
		n++
		p := filepath.Join(t.TempDir(), fmt.Sprintf("req%d.json", n))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}

	for _, tc := range []struct {
		name  string
		f     runFlags
		check func(t *testing.T, r envelope.RunRequest)
		err   string
	}{
		{name: "demo", f: runFlags{demo: true}, check: func(t *testing.T, r envelope.RunRequest) {
			require.Equal(t, "demo-1700000000000000042", r.RunID)
			require.Equal(t, "scripted", r.Agent.Model.Provider)
			require.NotEmpty(t, r.Agent.Model.Options)
		}},
		{name: "demo on a real model", f: runFlags{demo: true, provider: "openai", model: "gpt-4o-mini", runID: "r1"},
			check: func(t *testing.T, r envelope.RunRequest) {
				require.Equal(t, "r1", r.RunID)
				require.Equal(t, envelope.Model{Provider: "openai", Name: "gpt-4o-mini"}, r.Agent.Model, "the script is dropped")
				require.Equal(t, demo.Request("x").Messages, r.Messages)
			}},
		{name: "prompt", f: runFlags{provider: "anthropic", model: "claude-haiku-4-5", prompt: "What is 17*23?", maxBudget: 0.05},
			check: func(t *testing.T, r envelope.RunRequest) {
				require.Equal(t, []envelope.Message{{Role: envelope.RoleUser, Content: "What is 17*23?"}}, r.Messages)
				require.Equal(t, demo.Request("x").Agent.EnabledTools, r.Agent.EnabledTools)
				require.Equal(t, 0.05, r.Agent.Policy.MaxBudget)
			}},
		{name: "file keeps its settings, takes the model", f: runFlags{file: file, provider: "anthropic", model: "claude-sonnet-4-5"},
			check: func(t *testing.T, r envelope.RunRequest) {
				require.Equal(t, "from-file", r.RunID)
				require.Equal(t, envelope.Model{Provider: "anthropic", Name: "claude-sonnet-4-5", Temperature: &temp}, r.Agent.Model)
			}},
		{name: "nothing to run", f: runFlags{}, err: "give a run request with --file, --demo, or --prompt"},
		{name: "provider without model", f: runFlags{demo: true, provider: "openai"}, err: "--provider and --model go together"},
		{name: "model without provider", f: runFlags{demo: true, model: "gpt-4o"}, err: "--provider and --model go together"},
		{name: "prompt on the scripted model", f: runFlags{prompt: "hi"}, err: "--prompt needs a real model"},
		{name: "demo and file", f: runFlags{demo: true, file: file}, err: "either --demo or --file"},
		{name: "negative budget", f: runFlags{demo: true, maxBudget: -1}, err: "--max-budget must not be negative"},
		{name: "bad run id", f: runFlags{demo: true, runID: "a.b"}, err: "run_id"},
		{name: "deadline", f: runFlags{demo: true, deadline: 90*time.Second + time.Millisecond},
			check: func(t *testing.T, r envelope.RunRequest) { require.Equal(t, 91, r.DeadlineS, "rounded up") }},
		{name: "negative deadline", f: runFlags{demo: true, deadline: -time.Second}, err: "--deadline must not be negative"},
		{name: "stream", f: runFlags{demo: true, stream: true},
			check: func(t *testing.T, r envelope.RunRequest) { require.True(t, r.Agent.Stream, "agent.stream") }},
		{name: "no stream unless asked", f: runFlags{demo: true},
			check: func(t *testing.T, r envelope.RunRequest) { require.False(t, r.Agent.Stream) }},
		{name: "a file that ends early", f: runFlags{file: write(`{"run_id":"x"`)}, err: "invalid JSON: it ends before its value does"},
		{name: "a file with more after the request", f: runFlags{file: write(string(b) + ` {"run_id":"another"}`)},
			err: "invalid JSON: content after its value"},
		{name: "a file that is not JSON", f: runFlags{file: write(`run_id: x`)}, err: "run request "},
		{name: "a field a run request lacks", f: runFlags{file: write(`{"run_id":"x","colour":"red"}`)}, err: `unknown field "colour"`},
		{name: "deadline past a day", f: runFlags{demo: true, deadline: 25 * time.Hour}, err: "deadline_s 90000 must be 1 to 86400 seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := buildRunRequest(tc.f, strings.NewReader(""), now)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			tc.check(t, r)
		})
	}
}

// fakeOpenAI answers Chat Completions in their wire format: first a
// calculator call, then the answer; it keeps the request bodies.
type fakeOpenAI struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	n := len(f.bodies)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n == 1 {
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini-2024-07-18",
		  "choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[
		    {"id":"call_1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"17*23\"}"}}]},
		    "logprobs":null,"finish_reason":"tool_calls"}],
		  "usage":{"prompt_tokens":300,"completion_tokens":20,"total_tokens":320}}`)
		return
	}
	_, _ = io.WriteString(w, `{"id":"chatcmpl-2","object":"chat.completion","created":2,"model":"gpt-4o-mini-2024-07-18",
	  "choices":[{"index":0,"message":{"role":"assistant","content":"17*23 = 391."},"logprobs":null,"finish_reason":"stop"}],
	  "usage":{"prompt_tokens":350,"completion_tokens":8,"total_tokens":358}}`)
}

// With OPENAI_API_KEY and OPENAI_BASE_URL in the environment, the stack's
// orchestrator (as `toolwire dev` builds it) serves the openai provider, and
// `toolwire run --provider openai` runs on it.
func TestRunCommandOnARealModel(t *testing.T) {
	fake := &fakeOpenAI{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	t.Setenv("OPENAI_API_KEY", "sk-test")
	t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	out, errOut, err := runCLI(t, "", "run", "--nats", st.URL, "--provider", "openai", "--model", "gpt-4o-mini",
		"--prompt", "What is 17*23? Use a tool.", "--run-id", "real-model-1")
	require.NoError(t, err, errOut)
	var outputs envelope.AgentOutputs
	require.NoError(t, json.Unmarshal([]byte(out), &outputs), out)
	require.Equal(t, "17*23 = 391.", outputs.Response)
	require.Len(t, outputs.ToolOrder, 1)
	require.JSONEq(t, `{"result":391}`, string(outputs.ToolsByID[outputs.ToolOrder[0]].Output))
	require.Contains(t, errOut, "spend: 0.000114", "300+350 input and 20+8 output tokens at gpt-4o-mini's price")

	fake.mu.Lock()
	defer fake.mu.Unlock()
	require.Len(t, fake.bodies, 2)
	require.Equal(t, "gpt-4o-mini", fake.bodies[0]["model"])
	var names []string
	for _, tl := range fake.bodies[0]["tools"].([]any) {
		names = append(names, tl.(map[string]any)["function"].(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"echo", "calculator", "get_current_time"}, names)
	msgs := fake.bodies[1]["messages"].([]any)
	last := msgs[len(msgs)-1].(map[string]any)
	require.Equal(t, map[string]any{"role": "tool", "tool_call_id": "call_1", "content": `{"result":391}`}, last)
}

// `toolwire dev --demo` needs no API key.
func TestDevDemoWithoutAPIKey(t *testing.T) {
	for _, k := range []string{"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"} {
		t.Setenv(k, "")
	}
	out, errOut, err := runCLI(t, "", "dev", "--demo", "--data-dir", t.TempDir(), "--database-url", pgtest.Schema(t))
	require.NoError(t, err, errOut)
	var outputs envelope.AgentOutputs
	require.NoError(t, json.Unmarshal([]byte(out), &outputs), out)
	require.Equal(t, demo.Response, outputs.Response)
	require.Len(t, outputs.ToolOrder, 4)
	require.Contains(t, errOut, "recorded: ")
}

// TestRunStream: `toolwire run --stream` on a stack (as `toolwire dev` runs
// it) shows each model call's answer as it streams, on a thinking line
// before the turn's line; with -o json, each delta is a JSON line of type
// delta, before its turn's event, and the deltas of a call add up to its
// answer. Standard output is the outputs either way.
func TestRunStream(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	t.Run("text", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "run", "--demo", "--stream", "--run-id", "stream-text", "--nats", st.URL)
		require.NoError(t, err, errOut)
		var outputs envelope.AgentOutputs
		require.NoError(t, json.Unmarshal([]byte(out), &outputs), out)
		require.Equal(t, demo.Response, outputs.Response)
		for _, want := range []string{
			"  thinking (turn 1): [calls echo] [calls calculator] [calls get_current_time] \n  model turn 1: 3 tool call(s)",
			"  thinking (turn 2): [calls calculator] \n  model turn 2: 1 tool call(s)",
			"  thinking (turn 3): " + demo.Response + "\n  model turn 3: 0 tool call(s)",
		} {
			require.Contains(t, errOut, want)
		}
	})

	t.Run("json", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "run", "--demo", "--stream", "-o", "json", "--run-id", "stream-json", "--nats", st.URL)
		require.NoError(t, err, errOut)
		var outputs envelope.AgentOutputs
		require.NoError(t, json.Unmarshal([]byte(out), &outputs), "standard output is the outputs: %s", out)
		text := map[int]string{} // per model call, its deltas' text
		turned := map[int]bool{} // model calls whose turn came
		var calls []string       // tool names, as their calls started
		for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
			var l struct {
				Type      string `json:"type"`
				Iteration int    `json:"iteration"`
				Seq       int    `json:"seq"`
				Text      string `json:"text"`
				ToolCall  *struct {
					Name string `json:"name"`
				} `json:"tool_call"`
				Event *struct {
					Type string `json:"type"`
					Data struct {
						Iteration int `json:"iteration"`
						Turn      *struct {
							Iteration int `json:"iteration"`
						} `json:"turn"`
					} `json:"data"`
				} `json:"event"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &l), "every progress line is JSON: %q", line)
			switch l.Type {
			case "delta":
				require.False(t, turned[l.Iteration], "a delta of call %d after its turn: %s", l.Iteration, line)
				text[l.Iteration] += l.Text
				if l.ToolCall != nil && l.ToolCall.Name != "" {
					calls = append(calls, l.ToolCall.Name)
				}
			case "event":
				require.NotNil(t, l.Event, line)
				switch {
				case l.Event.Type == events.TypeTurnCompleted:
					turned[l.Event.Data.Iteration] = true
				case l.Event.Data.Turn != nil:
					turned[l.Event.Data.Turn.Iteration] = true
				}
			default:
				t.Fatalf("a progress line of type %q: %s", l.Type, line)
			}
		}
		require.Equal(t, demo.Response, text[3], "the final call's deltas add up to its answer")
		require.Equal(t, []string{"echo", "calculator", "get_current_time", "calculator"}, calls)
		require.Equal(t, map[int]bool{1: true, 2: true, 3: true}, turned)
	})
}
