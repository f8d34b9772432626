package executor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
)

// TestMCPTools registers a real MCP server (built with the SDK) over stdio
// and over streamable HTTP, and calls its tools through the executor.
func TestMCPTools(t *testing.T) {
	for _, transport := range []mcp.Transport{mcp.Stdio, mcp.HTTP} {
		t.Run(string(transport), func(t *testing.T) {
			var srv mcp.Server
			if transport == mcp.Stdio {
				srv = mcptest.Stdio(t, "calc")
			} else {
				srv = mcptest.HTTP(t, "calc")
			}
			env := eventstest.Start(t)
			schemas := newEventSchemas(t)
			reg := openRegistry(t, env.JS)

			r, err := mcp.RegisterServer(t.Context(), reg, srv, mcp.RegisterOptions{Version: "2.0.0", TimeoutMS: 1000})
			require.NoError(t, err)
			require.Empty(t, r.Skipped)
			var names []string
			for _, d := range r.Tools {
				names = append(names, d.Ref().String())
			}
			require.Equal(t, []string{"calc_add@2.0.0", "calc_crash@2.0.0", "calc_fail@2.0.0", "calc_greet@2.0.0", "calc_hang@2.0.0", "calc_math_pi@2.0.0"}, names)

			// The registry holds them with their schemas and implementation.
			add, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_add", Version: "2.0.0"})
			require.NoError(t, err)
			require.Equal(t, registry.StateActive, add.State)
			require.Equal(t, "Adds two numbers.", add.Definition.Description)
			require.Equal(t, envelope.SideEffectsWrites, add.Definition.Metadata.SideEffects, "no readOnlyHint: writes")
			require.Equal(t, envelope.CategoryAPI, add.Definition.Metadata.Category)
			require.Equal(t, 1000, add.Definition.TimeoutMS)
			var in map[string]any
			require.NoError(t, json.Unmarshal(add.Definition.InputSchema, &in))
			require.Equal(t, "object", in["type"])
			require.ElementsMatch(t, []any{"a", "b"}, in["required"])
			require.Contains(t, string(add.Definition.OutputSchema), `"sum"`)
			require.Equal(t, envelope.ImplMCP, add.Definition.Implementation.Kind)
			cfg, err := mcp.ParseConfig(add.Definition.Implementation.Config)
			require.NoError(t, err)
			require.Equal(t, mcp.Config{Server: "calc", Transport: transport, Command: srv.Command, Args: srv.Args, URL: srv.URL, Tool: "add"}, cfg)
			greet, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_greet", Version: "2.0.0"})
			require.NoError(t, err)
			require.Equal(t, envelope.SideEffectsReads, greet.Definition.Metadata.SideEffects, "readOnlyHint: reads")
			require.Empty(t, greet.Definition.OutputSchema)
			pi, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_math_pi", Version: "2.0.0"})
			require.NoError(t, err)
			require.Contains(t, string(pi.Definition.Implementation.Config), `"tool":"math.pi"`)

			// A stale entry: the server has no such tool.
			stale := add.Definition
			stale.Name = "calc_gone"
			cfg.Tool = "gone"
			stale.Implementation = mcp.Implementation(cfg)
			require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: stale}))

			startExecutor(t, env, Config{Concurrency: 8, ID: "executor-mcp"})
			runID := "run-mcp-" + string(transport)
			w := watchRun(t, env.JS, runID)
			pub := events.NewPublisher(env.JS)
			calls := map[string]events.CallRequest{
				"add":       callRequest(t, runID, 1, "calc_add", "2.0.0", `{"a":2,"b":3}`),
				"greet":     callRequest(t, runID, 2, "calc_greet", "2.0.0", `{"name":"Ada"}`),
				"fail":      callRequest(t, runID, 3, "calc_fail", "2.0.0", `{"reason":"on purpose"}`),
				"bad input": callRequest(t, runID, 4, "calc_add", "2.0.0", `{"a":"two"}`),
				"pi":        callRequest(t, runID, 5, "calc_math_pi", "2.0.0", `{}`),
				"hang":      callRequest(t, runID, 6, "calc_hang", "2.0.0", `{}`),
				"gone":      callRequest(t, runID, 7, "calc_gone", "2.0.0", `{"a":1,"b":1}`),
			}
			for _, c := range calls {
				publishApproved(t, pub, c)
			}
			e := w.envelopeOf(t, schemas, calls["add"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":5}`, string(e.Output), "structured content is the output")

			e = w.envelopeOf(t, schemas, calls["greet"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"content":[{"type":"text","text":"Hello, Ada!"}]}`, string(e.Output), "text content")

			e = w.envelopeOf(t, schemas, calls["fail"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeProviderError, e.Error.Code)
			require.Equal(t, "MCP server calc, tool fail: the tool failed: on purpose", e.Error.Message)

			e = w.envelopeOf(t, schemas, calls["bad input"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeValidation, e.Error.Code, "checked against the MCP tool's input schema before the call")

			e = w.envelopeOf(t, schemas, calls["pi"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":3.14159}`, string(e.Output))

			e = w.envelopeOf(t, schemas, calls["hang"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeTimeout, e.Error.Code, "the tool's timeout_ms ends the call")

			e = w.envelopeOf(t, schemas, calls["gone"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeProviderError, e.Error.Code)
			require.Contains(t, e.Error.Message, `has no tool gone any more: unknown tool "gone" (register the server again)`)

			// The session survives the calls: one more call after the hang
			// still works on it.
			again := callRequest(t, runID, 8, "calc_add", "2.0.0", `{"a":10,"b":-4}`)
			publishApproved(t, pub, again)
			e = w.envelopeOf(t, schemas, again)
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":6}`, string(e.Output))
		})
	}
}
