package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// newDripServer answers every request with its headers at once, then a byte
// of its body every 100ms, until the client goes away.
func newDripServer(t *testing.T, contentType string) *counted {
	t.Helper()
	return newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				if _, err := w.Write([]byte(" ")); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
			}
		}
	})
}

// TestSlowBodyIsCutAtTheDeadline: a response whose body drips in is cut when
// the call's time runs out, and the tool fails with the limit that ran out:
// the call's own (its context's cause, which the executor reports as
// TIMEOUT), or the web tools' request timeout (TIMEOUT naming it). Before,
// a failed body read closed a nil response and panicked. The bound on each
// call is the test's 10s context, a safety net, not a timing assertion.
func TestSlowBodyIsCutAtTheDeadline(t *testing.T) {
	jsonSrv := newDripServer(t, "application/json")
	htmlSrv := newDripServer(t, "text/html")
	allow := []string{jsonSrv.hostPort(), htmlSrv.hostPort()}
	callLimit := errors.New("the call's time limit")

	tools := []struct {
		name  string
		tool  func(*Client) toolapi.Tool
		input string
	}{
		{name: "http_get", tool: func(c *Client) toolapi.Tool { return httpTool{web: c, getOnly: true, now: time.Now} },
			input: input(map[string]any{"url": jsonSrv.URL + "/drip"})},
		{name: "http_request", tool: func(c *Client) toolapi.Tool { return httpTool{web: c, now: time.Now} },
			input: input(map[string]any{"method": "POST", "url": jsonSrv.URL + "/drip", "body": map[string]any{"a": 1}})},
		{name: "web_fetch", tool: func(c *Client) toolapi.Tool { return webFetchTool{web: c, now: time.Now} },
			input: input(map[string]any{"url": htmlSrv.URL + "/drip"})},
	}
	limits := []struct {
		name  string
		cfg   Config
		ctx   func(context.Context) (context.Context, context.CancelFunc)
		check func(t *testing.T, tool string, err error)
	}{
		{
			name: "the call's deadline",
			cfg:  Config{AllowHosts: allow},
			ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
				return context.WithTimeoutCause(ctx, 300*time.Millisecond, callLimit)
			},
			check: func(t *testing.T, _ string, err error) {
				require.ErrorIs(t, err, callLimit)
			},
		},
		{
			name: "the request timeout",
			cfg:  Config{AllowHosts: allow, RequestTimeout: 300 * time.Millisecond},
			ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
				return context.WithCancel(ctx)
			},
			check: func(t *testing.T, tool string, err error) {
				var te *envelope.ToolError
				require.ErrorAs(t, err, &te)
				require.Equal(t, envelope.CodeTimeout, te.Code)
				require.Equal(t, tool+": no complete response within 300ms, the web tools' request timeout", te.Message)
			},
		},
	}
	for _, l := range limits {
		c := newTestClient(t, l.cfg)
		for _, tc := range tools {
			t.Run(l.name+"/"+tc.name, func(t *testing.T) {
				safety, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				ctx, cancelCall := l.ctx(safety)
				defer cancelCall()
				out, err := tc.tool(c).Execute(ctx, json.RawMessage(tc.input), toolapi.Context{TenantID: "acme"})
				require.Nil(t, out)
				require.Error(t, err)
				require.NoError(t, safety.Err(), "the read went on past the limit")
				l.check(t, tc.name, err)
			})
		}
	}
}
