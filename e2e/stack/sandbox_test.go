package stack_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/sandbox"
	"github.com/toolwire/toolwire/stack"
)

// needSandboxRuntimes fails the test (or, outside CI with
// TOOLWIRE_SKIP_SANDBOX=1, skips it) when the sandbox runtimes cannot run here.
func needSandboxRuntimes(t *testing.T) {
	t.Helper()
	var missing string
	switch {
	case os.Geteuid() != 0:
		missing = "the sandbox tests run as root"
	default:
		for _, bin := range []string{"bwrap", "runsc", "/usr/bin/python3"} {
			if _, err := exec.LookPath(bin); err != nil {
				missing = bin + " is not installed (.ci/run installs bubblewrap, runsc and python3)"
			}
		}
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") != "true" && os.Getenv("TOOLWIRE_SKIP_SANDBOX") == "1" {
		t.Skip(missing)
	}
	t.Fatal(missing + "; outside CI, TOOLWIRE_SKIP_SANDBOX=1 skips this test")
}

// wordStats is a code tool: a registry entry whose implementation is Python
// source run by the sandbox, here pinned to the bwrap runtime.
func wordStats(t *testing.T) envelope.ToolDefinition {
	t.Helper()
	cfg, err := json.Marshal(events.SandboxToolConfig{
		Language: events.SandboxPython, Runtime: events.SandboxRuntimeBwrap,
		Source: `import json, sys
words = json.load(sys.stdin)["text"].split()
print(json.dumps({"words": len(words), "longest": max(words, key=len)}))
`,
	})
	require.NoError(t, err)
	return envelope.ToolDefinition{
		Name: "word_stats", Version: "1.0.0", Description: "Counts the words of a text.",
		InputSchema:    json.RawMessage(`{"type":"object","required":["text"],"properties":{"text":{"type":"string","minLength":1}},"additionalProperties":false}`),
		OutputSchema:   json.RawMessage(`{"type":"object","required":["words","longest"],"properties":{"words":{"type":"integer"},"longest":{"type":"string"}},"additionalProperties":false}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryCode, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		TimeoutMS:      20_000,
		Implementation: envelope.Implementation{Kind: envelope.ImplSandbox, Config: cfg},
	}
}

// sandboxResult reads the sandbox's result of a call from the stream.
func sandboxResult(t *testing.T, st *stack.Stack, runID, callID string) events.SandboxResult {
	t.Helper()
	subj, err := events.SandboxSubject(runID, callID, "completed")
	require.NoError(t, err)
	var res events.SandboxResult
	require.True(t, lastEventData(t, st.JS, events.StreamSandbox, subj, &res), "no sandbox result of %s", callID)
	return res
}

// startSandboxStack starts the stack with a sandbox of the given
// concurrency, after registering the code tools defs: every catalog holds
// them from the start.
func startSandboxStack(t *testing.T, concurrency int, defs ...envelope.ToolDefinition) *stack.Stack {
	t.Helper()
	needSandboxRuntimes(t)
	env := eventstest.Start(t)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	for _, def := range defs {
		require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: def}))
	}
	return startStack(t, stack.Options{NATSURL: env.URL, Sandbox: &sandbox.Config{StateDir: t.TempDir(), Concurrency: concurrency}})
}

// TestSandboxToolsEndToEnd runs a scripted agent through policy, executor and
// the sandbox service: python_exec (on the deployment's runtime, gVisor) and
// a registered code tool (pinned to bwrap) in parallel, then python_exec with
// a memory bomb whose SANDBOX_ERROR goes back to the model, then the answer.
// A second agent, without python_exec enabled, is refused by policy.
func TestSandboxToolsEndToEnd(t *testing.T) {
	st := startSandboxStack(t, 2, wordStats(t))

	sum := map[string]any{"code": "import json, sys\nprint(sum(json.load(sys.stdin)))", "input": []int{1, 2, 3, 36}}
	bomb := map[string]any{"code": "x = []\nwhile True:\n    x.append(bytearray(64 << 20))\n"}
	req := scripted(t, "sandbox-e2e-1", []string{"python_exec@1.0.0", "word_stats@1.0.0"},
		map[string]any{"tool_calls": []any{call("python_exec", sum), call("word_stats", map[string]any{"text": "the quick brown fox"})}},
		map[string]any{"tool_calls": []any{call("python_exec", bomb)}},
		map[string]any{"content": "the sum is 42"})
	final := runToEnd(t, st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	out := final.Outputs
	require.Equal(t, "the sum is 42", out.Response)
	require.Len(t, out.ToolOrder, 3)

	py := out.ToolsByID[out.ToolOrder[0]]
	require.Equal(t, "python_exec", py.Name)
	require.Nil(t, py.Error)
	require.JSONEq(t, `{"stdout":"42\n","stderr":""}`, string(py.Output))
	require.Equal(t, sandbox.RuntimeGVisor, sandboxResult(t, st, req.RunID, py.CallID).Runtime)

	ws := out.ToolsByID[out.ToolOrder[1]]
	require.Equal(t, "word_stats", ws.Name)
	require.Nil(t, ws.Error)
	require.JSONEq(t, `{"words":4,"longest":"quick"}`, string(ws.Output))
	require.Equal(t, sandbox.RuntimeBwrap, sandboxResult(t, st, req.RunID, ws.CallID).Runtime)

	boom := out.ToolsByID[out.ToolOrder[2]]
	require.Equal(t, "python_exec", boom.Name)
	require.NotNil(t, boom.Error)
	require.Equal(t, envelope.CodeSandboxError, boom.Error.Code)
	require.Contains(t, boom.Error.Message, "memory limit hit")
	b, err := json.Marshal(boom.Error.Details)
	require.NoError(t, err)
	require.Contains(t, string(b), `"limit":"memory"`)
	require.Equal(t, ws.CallID, out.LastTool.CallID, "last_tool is the last successful call")

	// Without python_exec among its enabled tools, an agent cannot run code.
	denied := scripted(t, "sandbox-e2e-2", []string{"word_stats@1.0.0"},
		map[string]any{"tool_calls": []any{call("python_exec", sum)}},
		map[string]any{"content": "no code for me"})
	final = runToEnd(t, st, denied)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	refused := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.NotNil(t, refused.Error)
	require.Equal(t, envelope.CodePolicyDenied, refused.Error.Code)
}

// codeRunner is a tool like python_exec (the code comes in its input) pinned
// to one runtime, with a timeout of its own.
func codeRunner(t *testing.T, name, runtime string, timeoutMS int) envelope.ToolDefinition {
	t.Helper()
	def := sandbox.PythonExecDefinition()
	cfg, err := json.Marshal(events.SandboxToolConfig{Language: events.SandboxPython, CodeFromInput: true, Runtime: runtime})
	require.NoError(t, err)
	def.Name, def.TimeoutMS, def.Implementation.Config = name, timeoutMS, cfg
	return def
}

// TestSandboxTimeoutsEndToEnd: code that runs past its tool's timeout (a
// busy loop, a sleep, children that ignore SIGTERM) on either runtime comes
// back, through the executor, as the sandbox's TIMEOUT naming the wall_time
// limit: the executor waits for the sandbox's answer, which comes after the
// sandbox has stopped the job and before the call's own timeout ends.
func TestSandboxTimeoutsEndToEnd(t *testing.T) {
	runtimes := []string{sandbox.RuntimeGVisor, sandbox.RuntimeBwrap}
	var defs []envelope.ToolDefinition
	var tools []string
	for _, rt := range runtimes {
		defs = append(defs, codeRunner(t, "py_"+rt, rt, 8_000))
		tools = append(tools, defs[len(defs)-1].Ref().String())
	}
	programs := []struct{ name, code string }{
		{"busy loop", "while True:\n    pass\n"},
		{"sleep", "import time\ntime.sleep(600)\n"},
		{"children that ignore SIGTERM", `import os, signal, time
for spin in (True, False):
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            if not spin:
                time.sleep(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.wait()
`},
	}
	// All six at once: one sandbox slot each.
	st := startSandboxStack(t, len(runtimes)*len(programs), defs...)
	var calls []any
	for _, rt := range runtimes {
		for _, p := range programs {
			calls = append(calls, call("py_"+rt, map[string]any{"code": p.code}))
		}
	}
	req := scripted(t, "sandbox-timeouts-1", tools, map[string]any{"tool_calls": calls}, map[string]any{"content": "done"})
	final := runToEnd(t, st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Len(t, final.Outputs.ToolOrder, len(calls))
	for i, id := range final.Outputs.ToolOrder {
		rt, p := runtimes[i/len(programs)], programs[i%len(programs)]
		got := final.Outputs.ToolsByID[id]
		require.Equal(t, "py_"+rt, got.Name)
		require.NotNil(t, got.Error, "%s on %s: output %s", p.name, rt, got.Output)
		require.Equal(t, envelope.CodeTimeout, got.Error.Code, "%s on %s: %s", p.name, rt, got.Error.Message)
		require.Contains(t, got.Error.Message, "ran longer than its timeout", "%s on %s: the sandbox's TIMEOUT, not the executor's", p.name, rt)
		b, err := json.Marshal(got.Error.Details)
		require.NoError(t, err)
		var d struct {
			Limit   string `json:"limit"`
			Runtime string `json:"runtime"`
		}
		require.NoError(t, json.Unmarshal(b, &d))
		require.Equal(t, "wall_time", d.Limit, "%s on %s", p.name, rt)
		require.Equal(t, rt, d.Runtime, "%s on %s", p.name, rt)
	}
}
