package mcp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
)

// TestMain runs the binary as the stdio test MCP server when mcptest.Stdio
// started it, and checks for goroutines left behind otherwise.
func TestMain(m *testing.M) { mcptest.Main(m) }

// call runs one MCP tool of cfg as the executor does: through the pool's Tool
// for a registry entry; a writes tool is never sent twice.
func call(t *testing.T, pool *mcp.Pool, cfg mcp.Config, input json.RawMessage, writes bool) (json.RawMessage, error) {
	t.Helper()
	def := envelope.ToolDefinition{Name: "t", Version: "1.0.0", Implementation: mcp.Implementation(cfg)}
	def.Metadata.SideEffects = envelope.SideEffectsReads
	if writes {
		def.Metadata.SideEffects = envelope.SideEffectsWrites
	}
	tl, err := pool.Tool(&def)
	require.NoError(t, err)
	return tl.Execute(t.Context(), input, toolapi.Context{})
}

// TestReconnects: a stdio server that dies is a NETWORK_ERROR for the
// call that killed it, and the next call starts it again.
func TestReconnects(t *testing.T) {
	srv := mcptest.Stdio(t, "calc")
	pool := mcp.NewPool(t.Context(), nil, []string{"PATH=" + os.Getenv("PATH")})
	t.Cleanup(pool.Close)
	cfg := func(tool string) mcp.Config {
		return mcp.Config{Server: srv.Name, Transport: srv.Transport, Command: srv.Command, Args: srv.Args, Tool: tool}
	}
	out, err := call(t, pool, cfg("add"), json.RawMessage(`{"a":1,"b":2}`), false)
	require.NoError(t, err)
	require.JSONEq(t, `{"sum":3}`, string(out))

	_, err = call(t, pool, cfg("crash"), json.RawMessage(`{}`), true)
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code, te.Message)

	out, err = call(t, pool, cfg("add"), json.RawMessage(`{"a":2,"b":2}`), true)
	require.NoError(t, err, "a new session")
	require.JSONEq(t, `{"sum":4}`, string(out))

	// A server that cannot start is a NETWORK_ERROR too.
	_, err = call(t, pool, mcp.Config{Server: "nope", Transport: mcp.Stdio, Command: "/nonexistent/mcp-server", Tool: "x"}, nil, false)
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code)
	require.Contains(t, te.Message, "MCP server nope is unreachable")

	// And so is an HTTP server that does not answer.
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	_, err = call(t, pool, mcp.Config{Server: "down", Transport: mcp.HTTP, URL: url + "/mcp", Tool: "x"}, nil, false)
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code)

	// After Close, calls fail at once.
	pool.Close()
	_, err = call(t, pool, cfg("add"), json.RawMessage(`{"a":1,"b":2}`), false)
	require.ErrorIs(t, err, mcp.ErrPoolClosed)
}

// TestToolRefusesABadConfig: an entry whose implementation config does not
// name a server and a tool cannot run.
func TestToolRefusesABadConfig(t *testing.T) {
	pool := mcp.NewPool(t.Context(), nil, nil)
	t.Cleanup(pool.Close)
	_, err := pool.Tool(&envelope.ToolDefinition{Name: "t", Version: "1.0.0",
		Implementation: envelope.Implementation{Kind: envelope.ImplMCP, Config: json.RawMessage(`{"server":"s","transport":"http","url":"http://x"}`)}})
	require.ErrorContains(t, err, "no tool name")
}
