package executor

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/service"
)

// realTools are the executor's tools that reach beyond the process: the web
// tools (http_request, http_get, web_fetch), json_query, and the sessions to
// MCP servers that run registry entries of kind mcp.
type realTools struct {
	web *webClient
	mcp *mcpPool
}

// realToolOptions are the Options of the real tools.
type realToolOptions struct {
	web *WebConfig
}

// WithWebConfig sets the web tools' settings; without it they are read from
// the environment (TOOLWIRE_HTTP_ALLOW_HOSTS, TOOLWIRE_HTTP_MAX_RESPONSE_BYTES)
// through the dependencies' Getenv.
func WithWebConfig(c WebConfig) Option {
	return func(o *options) { o.real.web = &c }
}

// newRealTools builds the real tools from the options or the environment.
func newRealTools(d service.Deps, o realToolOptions, log *slog.Logger) (*realTools, []Tool, error) {
	var cfg WebConfig
	if o.web != nil {
		cfg = *o.web
	} else if d.Getenv != nil {
		var err error
		if cfg, err = WebConfigFromEnv(d.Getenv); err != nil {
			return nil, nil, fmt.Errorf("executor: %w", err)
		}
	}
	web, err := newWebClient(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("executor: %w", err)
	}
	rt := &realTools{web: web, mcp: newMCPPool(log, d.Getenv)}
	tools := []Tool{
		httpTool{web: web, now: time.Now},
		httpTool{web: web, getOnly: true, now: time.Now},
		webFetchTool{web: web, now: time.Now},
		jsonQueryTool{},
	}
	return rt, tools, nil
}

// close ends the MCP sessions and drops idle connections.
func (r *realTools) close() {
	if r == nil {
		return
	}
	r.mcp.close()
	r.web.close()
}

// toolFor returns the Tool that runs a registry entry: the in-process tool of
// its builtin key, or the MCP server's tool; or the error that explains why
// this executor cannot run it.
func (s *Service) toolFor(def *envelope.ToolDefinition) (Tool, *envelope.ToolError) {
	ref := def.Ref()
	if def.Implementation.Kind == envelope.ImplSandbox {
		return s.sandboxTool(def) // sandbox.go: the sandbox service runs it
	}
	if def.Implementation.Kind == envelope.ImplMCP && s.real != nil {
		cfg, err := parseMCPConfig(def.Implementation.Config)
		if err != nil {
			return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err)
		}
		return mcpTool{pool: s.real.mcp, def: *def, cfg: cfg}, nil
	}
	key, err := builtinKey(def)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err)
	}
	tool, ok := s.tools[key]
	if !ok {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s: builtin %q is not available in this executor", ref, key)
	}
	return tool, nil
}
