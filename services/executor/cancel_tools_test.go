package executor

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// TestCancelStopsHTTPAndMCPCalls: a cancel request cuts an HTTP tool's call
// and an MCP tool's call as it cuts a Go tool's: the HTTP request is
// cancelled (the server sees its request's context end), and the MCP server
// gets notifications/cancelled for the call in flight, which ends the
// server's handler; both calls are answered TIMEOUT, details.cancelled.
func TestCancelStopsHTTPAndMCPCalls(t *testing.T) {
	type endpoint struct {
		tool    string // name@version is tool@1.0.0
		opts    []Option
		arrived chan struct{} // the server has the call
		gone    chan struct{} // the server's handler saw its context end
		// cancelled is closed when the server received
		// notifications/cancelled (MCP only).
		cancelled chan struct{}
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, env *eventstest.Env) endpoint
	}{
		{"http", func(t *testing.T, env *eventstest.Env) endpoint {
			e := endpoint{tool: "block_http", arrived: make(chan struct{}, 1), gone: make(chan struct{}, 1)}
			srv := newServer(t, func(_ http.ResponseWriter, r *http.Request) {
				// Read, as a server does: then net/http watches the
				// connection and ends the request's context when the
				// client gives up on it.
				_, _ = io.ReadAll(r.Body)
				e.arrived <- struct{}{}
				select {
				case <-r.Context().Done():
					e.gone <- struct{}{}
				case <-time.After(waitLimit):
				}
			})
			def := httpDef(e.tool, envelope.SideEffectsReads, `{"url":"`+srv.URL+`/block"}`)
			def.TimeoutMS = 10_000
			_, err := openRegistry(t, env.JS).Register(t.Context(), def)
			require.NoError(t, err)
			e.opts = []Option{std.withWeb(web.Config{AllowHosts: []string{srv.Listener.Addr().String()}})}
			return e
		}},
		{"mcp", func(t *testing.T, env *eventstest.Env) endpoint {
			e := endpoint{tool: "slow_block", arrived: make(chan struct{}, 1), gone: make(chan struct{}, 1), cancelled: make(chan struct{})}
			server := sdk.NewServer(&sdk.Implementation{Name: "toolwire-cancel", Version: "0.0.1"}, nil)
			sdk.AddTool(server, &sdk.Tool{Name: "block", Description: "Blocks until cancelled.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
				func(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
					e.arrived <- struct{}{}
					select {
					case <-ctx.Done():
						e.gone <- struct{}{}
					case <-time.After(waitLimit):
					}
					return nil, nil, ctx.Err()
				})
			h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return server }, nil)
			var once sync.Once
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				// Every JSON-RPC message the client sends is a POST body.
				if r.Body != nil {
					b, _ := io.ReadAll(r.Body)
					if strings.Contains(string(b), `"notifications/cancelled"`) {
						once.Do(func() { close(e.cancelled) })
					}
					r.Body = io.NopCloser(bytes.NewReader(b))
				}
				h.ServeHTTP(w, r)
			})
			_, err := mcp.RegisterServer(t.Context(), openRegistry(t, env.JS),
				mcp.Server{Name: "slow", Transport: mcp.HTTP, URL: srv.URL + "/mcp"},
				mcp.RegisterOptions{Version: "1.0.0", TimeoutMS: 10_000})
			require.NoError(t, err)
			return e
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := eventstest.Start(t)
			e := c.setup(t, env)
			startExecutor(t, env, Config{ID: "executor-cancel-" + c.name}, e.opts...)
			js := env.JetStream(t)
			pub := publish.NewPublisher(js)
			runID := "run-cancel-" + c.name
			w := watchRun(t, js, runID)
			req := callRequest(t, runID, 1, e.tool, "1.0.0", `{"city":"Lyon"}`)
			if c.name == "mcp" {
				req = callRequest(t, runID, 1, e.tool, "1.0.0", `{}`)
			}
			publishApproved(t, pub, req)
			receive(t, e.arrived, "the server has the call")

			sent := time.Now()
			require.NoError(t, pub.Publish(t.Context(), testCancel(t, runID)))
			got := w.envelopeOf(t, newEventSchemas(t), req)
			took := time.Since(sent)
			receive(t, e.gone, "the server's handler sees its context end")
			t.Logf("%s: cancel to the envelope stored %s, to the server's handler stopped %s", c.name, took, time.Since(sent))
			if e.cancelled != nil {
				receive(t, e.cancelled, "the MCP server gets notifications/cancelled")
			}
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeTimeout, got.Error.Code)
			require.Equal(t, "stopped: "+cancelSaid, got.Error.Message)
			require.Less(t, took, 5*time.Second, "cut at the cancel, not at the tool's 10 s timeout")
		})
	}
}
