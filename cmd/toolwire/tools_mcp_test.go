package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
)

type sumIn struct {
	A float64 `json:"a"`
	B float64 `json:"b"`
}

type sumOut struct {
	Sum float64 `json:"sum"`
}

// mcpHTTPServer is a real MCP server, built with the official SDK, served
// over streamable HTTP.
func mcpHTTPServer(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "cli-test", Version: "0.0.1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "Adds two numbers.\nSecond line."},
		func(_ context.Context, _ *mcp.CallToolRequest, in sumIn) (*mcp.CallToolResult, sumOut, error) {
			return nil, sumOut{Sum: in.A + in.B}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Always fails."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return nil, nil, fmt.Errorf("quota exhausted upstream")
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(func() {
		srv.Close()
		// A client that had not ended its session by now (the test's stack
		// stops after this cleanup) leaves it open on the server: end it.
		for ss := range s.Sessions() {
			_ = ss.Close()
		}
	})
	return srv.URL + "/mcp"
}

// TestToolsMCPAdd registers an MCP server's tools with the CLI, then runs a
// scripted agent run through the whole pipeline that calls them.
func TestToolsMCPAdd(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	url := mcpHTTPServer(t)

	t.Run("bad arguments", func(t *testing.T) {
		cases := map[string][]string{
			"give either --command or --url, not both":   {"tools", "mcp", "add", "x", "--command", "srv", "--url", url},
			"give the server":                            {"tools", "mcp", "add", "x"},
			`--version "1.0"`:                            {"tools", "mcp", "add", "x", "--url", url, "--version", "1.0"},
			`--side-effects "deletes"`:                   {"tools", "mcp", "add", "x", "--url", url, "--side-effects", "deletes"},
			`--category "misc"`:                          {"tools", "mcp", "add", "x", "--url", url, "--category", "misc"},
			`MCP server name "bad name"`:                 {"tools", "mcp", "add", "bad name", "--url", url},
			"invalid command line string":                {"tools", "mcp", "add", "x", "--command", `srv "unclosed`},
			"scheme must be http or https":               {"tools", "mcp", "add", "x", "--url", "ftp://example.com/mcp"},
			"accepts 1 arg(s), received 0":               {"tools", "mcp", "add", "--url", url},
			"MCP server down (http://127.0.0.1:1/mcp)":   {"tools", "mcp", "add", "down", "--url", "http://127.0.0.1:1/mcp", "--nats", st.URL, "--timeout", "10s"},
			`connect to MCP server nope (/nonexistent/x`: {"tools", "mcp", "add", "nope", "--command", "/nonexistent/x --flag", "--nats", st.URL},
		}
		for want, args := range cases {
			_, _, err := runCLI(t, "", args...)
			require.ErrorContains(t, err, want, "%v", args)
		}
	})

	t.Run("dry run writes nothing", func(t *testing.T) {
		out, errOut, err := runCLI(t, "", "tools", "mcp", "add", "calc", "--url", url, "--dry-run")
		require.NoError(t, err, errOut)
		require.Contains(t, out, "calc_add@1.0.0")
		require.Contains(t, errOut, "would register 2 tools")
		reg, err := registry.Open(t.Context(), st.JS)
		require.NoError(t, err)
		_, err = reg.Get(t.Context(), envelope.ToolRef{Name: "calc_add", Version: "1.0.0"})
		require.ErrorIs(t, err, registry.ErrNotFound)
	})

	out, errOut, err := runCLI(t, "", "tools", "mcp", "add", "calc", "--url", url, "--version", "1.2.0", "--side-effects", "reads", "--tool-timeout", "5s", "--nats", st.URL)
	require.NoError(t, err, errOut)
	require.Contains(t, out, "calc_add@1.2.0   reads  Adds two numbers.\n")
	require.Contains(t, out, "calc_fail@1.2.0  reads  Always fails.\n")
	require.Contains(t, errOut, "registered 2 tools of MCP server calc ("+url+")")

	reg, err := registry.Open(t.Context(), st.JS)
	require.NoError(t, err)
	e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_add", Version: "1.2.0"})
	require.NoError(t, err)
	require.Equal(t, envelope.ImplMCP, e.Definition.Implementation.Kind)
	require.Equal(t, 5000, e.Definition.TimeoutMS)
	require.JSONEq(t, `{"server":"calc","transport":"http","url":"`+url+`","tool":"add"}`, string(e.Definition.Implementation.Config))

	// A whole run: the scripted model calls both tools, then answers.
	req := orchestratortest.Scripted(t, "run-mcp-cli", []string{"calc_add@1.2.0", "calc_fail@1.2.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("calc_add", map[string]any{"a": 40, "b": 2}),
			orchestratortest.ToolCall("calc_fail", map[string]any{}),
		}},
		map[string]any{"content": "40 + 2 = 42; the other tool failed."},
	)
	final := runCompleted(t, st, req)
	outs := final.Outputs
	require.Equal(t, "40 + 2 = 42; the other tool failed.", outs.Response)
	require.Len(t, outs.ToolOrder, 2)
	byName := map[string]envelope.ToolEnvelope{}
	for _, id := range outs.ToolOrder {
		byName[outs.ToolsByID[id].Name] = outs.ToolsByID[id]
	}
	require.Nil(t, byName["calc_add"].Error)
	require.JSONEq(t, `{"sum":42}`, string(byName["calc_add"].Output))
	require.NotNil(t, byName["calc_fail"].Error)
	require.Equal(t, envelope.CodeProviderError, byName["calc_fail"].Error.Code)
	require.Equal(t, "MCP server calc, tool fail: quota exhausted upstream", byName["calc_fail"].Error.Message)
	require.Equal(t, "calc_add", outs.LastTool.Name)
}
