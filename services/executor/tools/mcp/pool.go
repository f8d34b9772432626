package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Bounds of MCP sessions.
const (
	// connectTimeout bounds starting a server and its handshake.
	connectTimeout = 30 * time.Second
	// terminateAfter is how long a stdio server has to exit after its stdin
	// closes before it is signalled.
	terminateAfter = 2 * time.Second
	// errorTextLimit bounds the text of an MCP error result in a message.
	errorTextLimit = 4096
)

// InheritedEnv names the variables a stdio MCP server inherits from the
// executor's environment (the executor's Config.MCPEnv holds their values);
// nothing else: the executor's environment may hold secrets.
func InheritedEnv() []string { return []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"} }

// Pool keeps one client session per MCP server, shared by every call to
// that server's tools. A session that ends (the server exited, the HTTP
// session expired, a transport error) is dropped and the next call connects
// again. Close ends every session and waits for them.
type Pool struct {
	client *sdk.Client
	log    *slog.Logger
	env    []string
	// transport carries the HTTP sessions; closed at Close.
	transport *http.Transport
	// life ends at Close (or when the context NewPool got ends): it bounds
	// connects in progress and the stdio servers.
	life   context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	sessions map[string]*connection
	wg       sync.WaitGroup
}

// connection is one session, being connected or connected.
type connection struct {
	ready chan struct{} // closed when the connect finished
	cs    *sdk.ClientSession
	err   error
	dead  chan struct{} // closed when the session ended
}

// NewPool returns a pool whose sessions live, at the longest, as long as
// life (the executor's lifetime) or until Close. env ("NAME=value") is the
// whole environment of the stdio servers it starts; a nil log discards.
func NewPool(life context.Context, log *slog.Logger, env []string) *Pool {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(life)
	tr, _ := http.DefaultTransport.(*http.Transport)
	return &Pool{
		client:    sdk.NewClient(&sdk.Implementation{Name: "toolwire-executor", Version: "1.0.0"}, &sdk.ClientOptions{Logger: log}),
		log:       log,
		env:       slices.Clone(env),
		transport: tr.Clone(),
		life:      ctx,
		cancel:    cancel,
		sessions:  map[string]*connection{},
	}
}

// ErrPoolClosed is the error of a call after Close (the executor stopped).
var ErrPoolClosed = errors.New("MCP sessions are closed: the executor is stopping")

// session returns the live session of srv, connecting when there is none.
// Concurrent callers share one connect.
func (p *Pool) session(ctx context.Context, srv Server) (*sdk.ClientSession, error) {
	c, err := p.conn(ctx, srv)
	if err != nil {
		return nil, err
	}
	return c.cs, nil
}

// conn is session's connection, for a caller that may have to drop it.
func (p *Pool) conn(ctx context.Context, srv Server) (*connection, error) {
	key := srv.key()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		c, ok := p.sessions[key]
		if ok {
			select {
			case <-c.dead:
				delete(p.sessions, key)
				ok = false
			default:
			}
		}
		if !ok {
			c = &connection{ready: make(chan struct{}), dead: make(chan struct{})}
			p.sessions[key] = c
			p.wg.Add(1)
			go p.connect(context.WithoutCancel(ctx), srv, key, c)
		}
		p.mu.Unlock()

		select {
		case <-c.ready:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		if c.err != nil {
			return nil, c.err
		}
		select {
		case <-c.dead:
			continue // ended meanwhile: connect again
		default:
			return c, nil
		}
	}
}

// connect runs in its own goroutine (owned by the pool) so that a caller
// that gives up does not cancel a connect others wait for: base carries the
// first caller's values, not its cancellation; the connect is bounded by
// connectTimeout and by the pool's life. It then waits for the session to
// end and drops it.
func (p *Pool) connect(base context.Context, srv Server, key string, c *connection) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(base, connectTimeout)
	stop := context.AfterFunc(p.life, cancel)                             //nolint:contextcheck // the pool's close also ends a connect
	c.cs, c.err = p.client.Connect(ctx, p.transportFor(p.life, srv), nil) //nolint:contextcheck // a stdio server lives as long as the pool, not the connect
	stop()
	cancel()
	if c.err != nil {
		c.err = fmt.Errorf("connect to %s: %w", srv, c.err)
		close(c.dead)
		close(c.ready)
		p.drop(key, c)
		return
	}
	close(c.ready)
	p.log.Info("MCP session started", "server", srv.Name, "transport", string(srv.Transport))
	err := c.cs.Wait()
	close(c.dead)
	p.drop(key, c)
	p.log.Info("MCP session ended", "server", srv.Name, "err", err)
}

// drop forgets c unless a newer session replaced it.
func (p *Pool) drop(key string, c *connection) {
	p.mu.Lock()
	if p.sessions[key] == c {
		delete(p.sessions, key)
	}
	p.mu.Unlock()
}

// transportFor returns the SDK transport that reaches srv. A stdio server
// lives until its session is closed or, at the latest, until life ends.
func (p *Pool) transportFor(life context.Context, srv Server) sdk.Transport {
	if srv.Transport == HTTP {
		return &sdk.StreamableClientTransport{
			Endpoint:   srv.URL,
			HTTPClient: &http.Client{Transport: p.transport},
			// Calls only: no standing stream for server notifications.
			DisableStandaloneSSE: true,
			MaxRetries:           2,
		}
	}
	// The pool's life, not the call's context: the server outlives the call
	// that started it.
	cmd := exec.CommandContext(life, srv.Command, srv.Args...) //nolint:gosec // G204: the operator registered this command
	cmd.Env = append([]string{}, p.env...)
	cmd.Stderr = &stderrLog{log: p.log, server: srv.Name}
	return &sdk.CommandTransport{Command: cmd, TerminateDuration: terminateAfter}
}

// Close ends every session and waits until they are gone.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*connection, 0, len(p.sessions))
	for _, c := range p.sessions {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	// Live sessions first, gracefully (a stdio server sees its stdin close).
	for _, c := range conns {
		select {
		case <-c.ready:
			if c.cs != nil {
				_ = c.cs.Close()
			}
		default:
		}
	}
	// Then connects in progress are abandoned, and any server left is killed.
	p.cancel()
	for _, c := range conns {
		<-c.ready
		if c.cs != nil {
			_ = c.cs.Close()
		}
	}
	p.wg.Wait()
	p.transport.CloseIdleConnections()
}

// call calls a tool of an MCP server and maps the result to the taxonomy.
// A call that finds its session closed is tried once more on a new session
// when retrySafe (the tool does not write): the session may have ended
// between calls, before the pool noticed. A writes tool is never sent twice.
func (p *Pool) call(ctx context.Context, cfg Config, input json.RawMessage, retrySafe bool) (json.RawMessage, error) {
	srv := cfg.Target()
	args := input
	if len(bytes.TrimSpace(args)) == 0 || bytes.Equal(bytes.TrimSpace(args), []byte("null")) {
		args = json.RawMessage(`{}`)
	}
	for attempt := 1; ; attempt++ {
		c, err := p.conn(ctx, srv)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if errors.Is(err, ErrPoolClosed) {
				return nil, err
			}
			p.log.Warn("MCP server unreachable", "server", srv.String(), "err", err)
			return nil, envelope.NewToolError(envelope.CodeNetworkError, "MCP server %s is unreachable: %v", srv.Name, errors.Unwrap(err))
		}
		res, err := c.cs.CallTool(ctx, &sdk.CallToolParams{Name: cfg.Tool, Arguments: args})
		if err == nil {
			return callResult(srv, cfg.Tool, res)
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		var werr *jsonrpc.Error
		if errors.As(err, &werr) {
			return nil, rpcError(srv, cfg.Tool, werr)
		}
		// A transport failure: end the session so that calls connect again.
		p.drop(srv.key(), c)
		_ = c.cs.Close()
		if retrySafe && attempt == 1 && errors.Is(err, sdk.ErrConnectionClosed) {
			continue
		}
		p.log.Warn("MCP call failed", "server", srv.String(), "tool", cfg.Tool, "err", err)
		return nil, envelope.NewToolError(envelope.CodeNetworkError, "MCP server %s, tool %s: %v", srv.Name, cfg.Tool, err)
	}
}

// rpcError maps an MCP error response.
func rpcError(srv Server, tool string, werr *jsonrpc.Error) *envelope.ToolError {
	switch {
	case werr.Code == jsonrpc.CodeInvalidParams && strings.Contains(werr.Message, "unknown tool"):
		// The registration is stale: the server no longer has the tool.
		return envelope.NewToolError(envelope.CodeProviderError,
			"MCP server %s has no tool %s any more: %s (register the server again)", srv.Name, tool, werr.Message)
	case werr.Code == jsonrpc.CodeInvalidParams:
		return envelope.NewToolError(envelope.CodeValidation, "MCP server %s, tool %s: %s", srv.Name, tool, werr.Message)
	}
	return envelope.NewToolError(envelope.CodeProviderError, "MCP server %s, tool %s: %s", srv.Name, tool, werr.Message)
}

// callResult maps a tool's result: an error result is PROVIDER_ERROR with its
// text; structured content is the output; otherwise {"content": [...]}.
func callResult(srv Server, tool string, res *sdk.CallToolResult) (json.RawMessage, error) {
	if res.IsError {
		te := envelope.NewToolError(envelope.CodeProviderError, "MCP server %s, tool %s: %s", srv.Name, tool, contentText(res.Content))
		if b, err := json.Marshal(res.Content); err == nil {
			te = te.WithDetails(map[string]any{"content": json.RawMessage(b)})
		}
		return nil, te
	}
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, envelope.NewToolError(envelope.CodeProviderError, "MCP server %s, tool %s: structured content does not marshal: %v", srv.Name, tool, err)
		}
		return b, nil
	}
	content := res.Content
	if content == nil {
		content = []sdk.Content{}
	}
	return json.Marshal(map[string]any{"content": content})
}

// contentText joins the text of an MCP result's text content, bounded.
func contentText(cs []sdk.Content) string {
	var parts []string
	for _, c := range cs {
		if t, ok := c.(*sdk.TextContent); ok && strings.TrimSpace(t.Text) != "" {
			parts = append(parts, strings.TrimSpace(t.Text))
		}
	}
	s := strings.Join(parts, "\n")
	if s == "" {
		return "the tool reported an error without text"
	}
	if len(s) > errorTextLimit {
		s = strings.ToValidUTF8(s[:errorTextLimit], "") + "…"
	}
	return s
}

// Tool returns the Tool that runs a registry entry of kind mcp on this
// pool's sessions, or why its implementation config cannot run.
func (p *Pool) Tool(def *envelope.ToolDefinition) (toolapi.Tool, error) {
	cfg, err := ParseConfig(def.Implementation.Config)
	if err != nil {
		return nil, err
	}
	return mcpTool{pool: p, def: *def, cfg: cfg}, nil
}

// mcpTool runs one registry entry of kind mcp.
type mcpTool struct {
	pool *Pool
	def  envelope.ToolDefinition
	cfg  Config
}

func (t mcpTool) Definition() envelope.ToolDefinition { return t.def }

func (t mcpTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	return t.pool.call(ctx, t.cfg, input, t.def.Metadata.SideEffects != envelope.SideEffectsWrites)
}

// stderrLog logs what a stdio MCP server writes on its stderr, one record
// per write, bounded.
type stderrLog struct {
	log    *slog.Logger
	server string
}

func (w *stderrLog) Write(b []byte) (int, error) {
	s := strings.TrimSpace(string(b))
	if len(s) > 2048 {
		s = s[:2048] + "…"
	}
	if s != "" {
		w.log.Debug("MCP server stderr", "server", w.server, "text", strings.ToValidUTF8(s, ""))
	}
	return len(b), nil
}
