package stack_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/tools/builtin"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/stack"
)

// TestCallToAnUnservedQueue: a tool whose queue no worker serves does not
// hang its run: after the guard's bounded queue wait the call fails with a
// PROVIDER_ERROR envelope naming the queue, the model gets it as the call's
// result, and the run completes; a call of the same turn on the default
// queue runs.
func TestCallToAnUnservedQueue(t *testing.T) {
	getenv := func(k string) string {
		if k == policy.EnvQueueWait {
			return "500ms"
		}
		return os.Getenv(k)
	}
	st := startStack(t, stack.Options{Getenv: getenv})
	reg, err := registry.Open(t.Context(), st.JS)
	require.NoError(t, err)
	var upper envelope.ToolDefinition
	for _, tl := range builtin.Tools() {
		if d := tl.Definition(); d.Name == "echo" {
			upper = d
		}
	}
	upper.Name, upper.Queue = "upper", "text" // echo's implementation, on a queue nobody serves
	_, err = reg.Register(t.Context(), upper)
	require.NoError(t, err)

	final := runToEnd(t, st, scripted(t, "unserved-1", []string{"upper@1.0.0", "echo@1.0.0"},
		map[string]any{"tool_calls": []any{call("upper", map[string]any{"text": "hi"}), call("echo", map[string]any{"text": "hi"})}},
		map[string]any{"content": "done"}))
	lost := envelopeAt(t, final, 1)
	require.NotNil(t, lost.Error, "the call to the unserved queue failed")
	require.Equal(t, envelope.CodeProviderError, lost.Error.Code)
	require.Contains(t, lost.Error.Message, `no live worker serves queue "text"`)
	require.Nil(t, envelopeAt(t, final, 2).Error, "the call on the default queue ran")
	require.Equal(t, "done", final.Outputs.Response)
}
