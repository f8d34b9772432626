package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// mcpTestServerArg makes the test binary run the test MCP server on stdio
// (see TestMain): the stdio tests start the real SDK server as a real child
// process without building another binary.
const mcpTestServerArg = "toolwire-test-mcp-server"

// runTestMCPServerIfAsked serves MCP on stdio and reports true when the test
// binary was started as the test MCP server.
func runTestMCPServerIfAsked() (int, bool) {
	if len(os.Args) < 2 || os.Args[1] != mcpTestServerArg {
		return 0, false
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := newTestMCPServer().Run(ctx, &mcp.StdioTransport{}); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "test MCP server:", err)
		return 1, true
	}
	return 0, true
}

type addIn struct {
	A float64 `json:"a" jsonschema:"the first term"`
	B float64 `json:"b" jsonschema:"the second term"`
}

type addOut struct {
	Sum float64 `json:"sum"`
}

type greetIn struct {
	Name string `json:"name"`
}

type failIn struct {
	Reason string `json:"reason"`
}

// newTestMCPServer is a real MCP server built with the SDK: tools with
// structured output, text output, an error result, a crash, a hang, and a
// name that is not a valid toolwire name.
func newTestMCPServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "toolwire-test", Version: "0.0.1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "Adds two numbers."},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "greet", Description: "Greets someone.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in greetIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "Hello, " + in.Name + "!"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Always fails."},
		func(_ context.Context, _ *mcp.CallToolRequest, in failIn) (*mcp.CallToolResult, any, error) {
			return nil, nil, fmt.Errorf("the tool failed: %s", in.Reason)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "hang", Description: "Never answers."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			<-ctx.Done()
			return nil, nil, ctx.Err()
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Exits the server process."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			os.Exit(3)
			return nil, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "math.pi", Description: "A dotted name."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: 3.14159}, nil
		})
	return s
}

// stdioTestServer is the test MCP server as a stdio command.
func stdioTestServer(t *testing.T, name string) MCPServer {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return MCPServer{Name: name, Transport: MCPStdio, Command: exe, Args: []string{mcpTestServerArg}}
}

// httpTestServer serves the test MCP server over streamable HTTP.
func httpTestServer(t *testing.T, name string) MCPServer {
	t.Helper()
	server := newTestMCPServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return MCPServer{Name: name, Transport: MCPHTTP, URL: srv.URL + "/mcp"}
}

func TestMCPServerValidate(t *testing.T) {
	ok := []MCPServer{
		{Name: "fs", Transport: MCPStdio, Command: "/usr/bin/mcp-fs", Args: []string{"--root", "/tmp"}},
		{Name: "api-2", Transport: MCPHTTP, URL: "https://mcp.example.com/mcp"},
	}
	for _, s := range ok {
		require.NoError(t, s.Validate(), s)
	}
	bad := map[string]MCPServer{
		`MCP server name "a b"`:                   {Name: "a b", Transport: MCPStdio, Command: "x"},
		`MCP server name ""`:                      {Transport: MCPStdio, Command: "x"},
		"a stdio MCP server needs a command":      {Name: "s", Transport: MCPStdio},
		"a stdio MCP server has no url":           {Name: "s", Transport: MCPStdio, Command: "x", URL: "http://x"},
		"scheme must be http or https":            {Name: "s", Transport: MCPHTTP, URL: "ftp://x"},
		"no host":                                 {Name: "s", Transport: MCPHTTP, URL: "http:///mcp"},
		"an http MCP server has no command":       {Name: "s", Transport: MCPHTTP, URL: "http://x", Command: "y"},
		`MCP transport "sse" is not one of stdio`: {Name: "s", Transport: "sse", URL: "http://x"},
		"NUL": {Name: "s", Transport: MCPStdio, Command: "x\x00"},
	}
	for want, s := range bad {
		require.ErrorContains(t, s.Validate(), want)
	}
	_, err := parseMCPConfig(json.RawMessage(`{"server":"s","transport":"http","url":"http://x"}`))
	require.ErrorContains(t, err, "no tool name")
	_, err = parseMCPConfig(json.RawMessage(`[1]`))
	require.ErrorContains(t, err, "mcp implementation config")

	require.Equal(t, "srv_add", mcpToolName("srv", "add", false))
	require.Equal(t, "add", mcpToolName("srv", "add", true))
	require.Equal(t, "srv_math_pi", mcpToolName("srv", "math.pi", false))
	long := mcpToolName("srv", string(make([]byte, 80)), false)
	require.Len(t, long, 64)
	require.NoError(t, envelope.ToolRef{Name: long, Version: "1.0.0"}.Validate())
}

// TestMCPTools registers a real MCP server (built with the SDK) over stdio
// and over streamable HTTP, and calls its tools through the executor.
func TestMCPTools(t *testing.T) {
	for _, transport := range []MCPTransport{MCPStdio, MCPHTTP} {
		t.Run(string(transport), func(t *testing.T) {
			var srv MCPServer
			if transport == MCPStdio {
				srv = stdioTestServer(t, "calc")
			} else {
				srv = httpTestServer(t, "calc")
			}
			env := eventstest.Start(t)
			schemas, err := events.NewSchemas()
			require.NoError(t, err)
			reg, err := registry.Open(t.Context(), env.JS)
			require.NoError(t, err)

			r, err := RegisterMCPServer(t.Context(), reg, srv, MCPRegisterOptions{Version: "2.0.0", TimeoutMS: 1000})
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
			cfg, err := parseMCPConfig(add.Definition.Implementation.Config)
			require.NoError(t, err)
			require.Equal(t, MCPConfig{Server: "calc", Transport: transport, Command: srv.Command, Args: srv.Args, URL: srv.URL, Tool: "add"}, cfg)
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
			stale.Implementation = MCPImplementation(cfg)
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

// TestMCPReconnects: a stdio server that dies is a NETWORK_ERROR for the
// call that killed it, and the next call starts it again.
func TestMCPReconnects(t *testing.T) {
	srv := stdioTestServer(t, "calc")
	pool := newMCPPool(nil, os.Getenv)
	t.Cleanup(pool.close)
	cfg := func(tool string) MCPConfig {
		return MCPConfig{Server: srv.Name, Transport: srv.Transport, Command: srv.Command, Args: srv.Args, Tool: tool}
	}
	out, err := pool.call(t.Context(), cfg("add"), json.RawMessage(`{"a":1,"b":2}`), true)
	require.NoError(t, err)
	require.JSONEq(t, `{"sum":3}`, string(out))

	_, err = pool.call(t.Context(), cfg("crash"), json.RawMessage(`{}`), false)
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code, te.Message)

	out, err = pool.call(t.Context(), cfg("add"), json.RawMessage(`{"a":2,"b":2}`), false)
	require.NoError(t, err, "a new session")
	require.JSONEq(t, `{"sum":4}`, string(out))

	// A server that cannot start is a NETWORK_ERROR too.
	_, err = pool.call(t.Context(), MCPConfig{Server: "nope", Transport: MCPStdio, Command: "/nonexistent/mcp-server", Tool: "x"}, nil, true)
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code)
	require.Contains(t, te.Message, "MCP server nope is unreachable")

	// And so is an HTTP server that does not answer.
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	_, err = pool.call(t.Context(), MCPConfig{Server: "down", Transport: MCPHTTP, URL: url + "/mcp", Tool: "x"}, nil, true)
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeNetworkError, te.Code)

	// After close, calls fail at once.
	pool.close()
	_, err = pool.call(t.Context(), cfg("add"), json.RawMessage(`{"a":1,"b":2}`), true)
	require.ErrorIs(t, err, errPoolClosed)
}
