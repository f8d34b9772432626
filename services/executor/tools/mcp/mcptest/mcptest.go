// Package mcptest is a real MCP server, built with the SDK, for the tests of
// the MCP tools: over streamable HTTP (HTTP), or over stdio as the test binary
// itself, started again as a child process (Stdio; its TestMain is Main, or
// calls ServeIfAsked first).
package mcptest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"syscall"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/services/executor/tools/mcp"
)

// serverArg makes the test binary run the test MCP server on stdio: the
// stdio tests start the real SDK server as a real child process without
// building another binary.
const serverArg = "toolwire-test-mcp-server"

// ServeIfAsked serves MCP on stdio and reports true when the test binary was
// started as the test MCP server; TestMain then exits with code:
//
//	if code, served := mcptest.ServeIfAsked(); served {
//		os.Exit(code)
//	}
func ServeIfAsked() (code int, served bool) {
	if len(os.Args) < 2 || os.Args[1] != serverArg {
		return 0, false
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := NewServer().Run(ctx, &sdk.StdioTransport{}); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "test MCP server:", err)
		return 1, true
	}
	return 0, true
}

// Main is the TestMain of a package that uses Stdio: the binary serves MCP
// when Stdio started it, and otherwise runs the tests and fails them when a
// goroutine is left behind (goleak, with opts).
func Main(m *testing.M, opts ...goleak.Option) {
	if code, served := ServeIfAsked(); served {
		os.Exit(code)
	}
	goleak.VerifyTestMain(m, opts...)
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

// NewServer is the test MCP server: tools with structured output (add, and
// math.pi, a name that is not a valid toolwire name), text output (greet, read
// only), an error result (fail), a crash that exits the server process
// (crash) and a hang (hang).
func NewServer() *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "toolwire-test", Version: "0.0.1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "Adds two numbers."},
		func(_ context.Context, _ *sdk.CallToolRequest, in addIn) (*sdk.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "greet", Description: "Greets someone.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *sdk.CallToolRequest, in greetIn) (*sdk.CallToolResult, any, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Hello, " + in.Name + "!"}}}, nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "fail", Description: "Always fails."},
		func(_ context.Context, _ *sdk.CallToolRequest, in failIn) (*sdk.CallToolResult, any, error) {
			return nil, nil, fmt.Errorf("the tool failed: %s", in.Reason)
		})
	sdk.AddTool(s, &sdk.Tool{Name: "hang", Description: "Never answers."},
		func(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
			<-ctx.Done()
			return nil, nil, ctx.Err()
		})
	sdk.AddTool(s, &sdk.Tool{Name: "crash", Description: "Exits the server process."},
		func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
			os.Exit(3)
			return nil, nil, nil
		})
	sdk.AddTool(s, &sdk.Tool{Name: "math.pi", Description: "A dotted name."},
		func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, addOut, error) {
			return nil, addOut{Sum: 3.14159}, nil
		})
	return s
}

// Stdio is the test MCP server as a stdio command: this test binary.
func Stdio(t testing.TB, name string) mcp.Server {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return mcp.Server{Name: name, Transport: mcp.Stdio, Command: exe, Args: []string{serverArg}}
}

// HTTP serves the test MCP server over streamable HTTP until the test ends.
func HTTP(t testing.TB, name string) mcp.Server {
	t.Helper()
	server := NewServer()
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return server }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return mcp.Server{Name: name, Transport: mcp.HTTP, URL: srv.URL + "/mcp"}
}
