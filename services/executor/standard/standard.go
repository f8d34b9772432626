// Package standard is the executor as its binary runs it: the executor's
// core (package executor) with the standard tool families, the built-in
// tools (package builtin), the web tools on the guarded web client (package
// web), and the kinds that run the registry entries of implementation kind
// http (package httptool), mcp (package mcp) and sandbox (package
// sandboxtool). The executor binary, `toolwire dev` and package stack build
// it with Build; a worker (package worker) builds the core alone, with its
// own Go tools, and links none of these families (nor gojq, the MCP SDK or
// html-to-markdown).
package standard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/builtin"
	"github.com/toolwire/toolwire/services/executor/tools/httptool"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/sandboxtool"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// Config configures the standard families.
type Config struct {
	// Web configures the web client of the web tools (http_request,
	// http_get, web_fetch) and of the http entries.
	Web web.Config
	// MCPEnv is the whole environment ("NAME=value") of the stdio MCP
	// servers the executor starts: the executor's own values of
	// mcp.InheritedEnv (PATH, HOME, ...), never the rest of its environment,
	// which may hold secrets.
	MCPEnv []string
}

// Validate checks the configuration; zero fields mean their defaults.
func (c Config) Validate() error {
	if err := c.Web.Validate(); err != nil {
		return fmt.Errorf("web tools: %w", err)
	}
	return nil
}

// ConfigFromEnv reads the standard families' configuration from the
// environment (the web tools' TOOLWIRE_HTTP_* variables, what MCP servers
// inherit), and reports every bad value at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	e := service.NewEnv(getenv)
	if v, ok := e.Lookup(web.EnvAllowHosts); ok {
		e.List(web.EnvAllowHosts, &c.Web.AllowHosts)
		e.Check(web.EnvAllowHosts, v, web.Config{AllowHosts: c.Web.AllowHosts}.Validate())
	}
	e.Scaled(web.EnvMaxResponseBytes, 1, web.MaxResponseBytesLimit, 1, &c.Web.MaxResponseBytes)
	for _, name := range mcp.InheritedEnv() {
		if v := e.Raw(name); v != "" {
			c.MCPEnv = append(c.MCPEnv, name+"="+v)
		}
	}
	if err := e.Err(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// FamilyEnvVars documents the variables ConfigFromEnv reads.
func FamilyEnvVars() []service.Var {
	vars := []service.Var{
		{Name: web.EnvAllowHosts, Help: "host[:port] entries, comma-separated, the web tools may reach although the SSRF guard refuses their addresses", Example: "api.internal:8443,127.0.0.1:9000"},
		{Name: web.EnvMaxResponseBytes, Help: "bytes of a response body the web tools read; the rest is dropped (default 2097152)", Example: "65536"},
	}
	examples := map[string]string{
		"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/executor", "LANG": "C.UTF-8",
		"LC_ALL": "C.UTF-8", "TMPDIR": "/var/tmp",
	}
	for _, name := range mcp.InheritedEnv() {
		vars = append(vars, service.Var{Name: name, Help: "passed on to the stdio MCP servers the executor starts (nothing else of its environment is)", Example: examples[name]})
	}
	return vars
}

// EnvVars documents every variable the executor binary reads besides the
// common ones of every service (service.CommonEnvVars): the executor's
// (executor.EnvVars) and the standard families' (FamilyEnvVars).
func EnvVars() []service.Var {
	return slices.Concat(executor.EnvVars(), FamilyEnvVars())
}

// Family is the standard families as one executor.Family, of its Config. It
// is a configuration: each executor that opens it gets its own web client
// and MCP sessions.
type Family struct{ cfg Config }

// NewFamily returns the standard families configured by cfg.
func NewFamily(cfg Config) *Family { return &Family{cfg: cfg} }

// Config returns the families' configuration.
func (f *Family) Config() Config { return f.cfg }

// Open builds the families' web client, tools and kinds for one executor.
func (f *Family) Open(h executor.Host) (executor.Opened, error) {
	wc, err := web.NewClient(f.cfg.Web)
	if err != nil {
		return executor.Opened{}, err
	}
	pool := &mcpKind{}
	endpoints, jobs := httptool.NewRunner(wc), sandboxtool.NewJobs(h.JS, h.Pub, h.Source, sandboxtool.Options{
		Log: h.Log, PublishFailures: h.SandboxJobs.PublishFailures, Resends: h.SandboxJobs.Resends,
	})
	return executor.Opened{
		Tools: slices.Concat(builtin.Tools(), web.Tools(wc)),
		Kinds: map[envelope.ImplementationKind]executor.Kind{
			envelope.ImplHTTP: kindFunc(func(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
				t, err := endpoints.Tool(def)
				if err != nil {
					return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run: %v", def.Ref(), err)
				}
				return t, nil
			}),
			envelope.ImplSandbox: kindFunc(func(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
				t, err := jobs.Tool(def)
				if err != nil {
					return nil, envelope.NewToolError(envelope.CodeSandboxError, "%v", err)
				}
				return t, nil
			}),
			envelope.ImplMCP: pool,
		},
		// The sessions of the MCP entries live as long as the executor runs.
		Start: func(life context.Context) error {
			pool.pool = mcp.NewPool(life, h.Log, f.cfg.MCPEnv)
			return nil
		},
		Close: func() {
			if pool.pool != nil {
				pool.pool.Close()
			}
			wc.Close()
		},
	}, nil
}

type kindFunc func(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError)

func (f kindFunc) Tool(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
	return f(def)
}

// mcpKind runs the MCP entries on the sessions of pool, set at Start.
type mcpKind struct{ pool *mcp.Pool }

func (k *mcpKind) Tool(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
	if k.pool == nil {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: it has not started", def.Ref())
	}
	t, err := k.pool.Tool(def)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", def.Ref(), err)
	}
	return t, nil
}

// WithConfig gives the executor the standard families configured by cfg,
// in place of those it has (an option of Build, executor.Build or
// executor.Config.With).
func WithConfig(cfg Config) executor.Option {
	return func(c *executor.Config) {
		c.Families = slices.DeleteFunc(slices.Clone(c.Families), func(f executor.Family) bool {
			_, ok := f.(*Family)
			return ok
		})
		c.Families = append([]executor.Family{NewFamily(cfg)}, c.Families...)
	}
}

// WithWebConfig sets the web tools' settings of the executor's standard
// families (adding them if it has none), replacing those read from the
// environment.
func WithWebConfig(w web.Config) executor.Option {
	return func(c *executor.Config) {
		std, _ := configIn(*c)
		std.Web = w
		WithConfig(std)(c)
	}
}

// configIn returns the configuration of the standard families of c, if it
// has them.
func configIn(c executor.Config) (Config, bool) {
	for _, f := range c.Families {
		if f, ok := f.(*Family); ok {
			return f.Config(), true
		}
	}
	return Config{}, false
}

// ConfigOf returns the configuration of the standard families s runs, if it
// runs them.
func ConfigOf(s *executor.Service) (Config, bool) { return configIn(s.Config()) }

// New builds an executor of cfg with the standard families configured by
// std.
func New(d service.Deps, cfg executor.Config, std Config) (*executor.Service, error) {
	return executor.New(d, cfg.With(WithConfig(std)))
}

// Build reads the executor's configuration and the standard families' from
// d.Getenv, applies opts and calls executor.New. It is what the executor
// binary and `toolwire dev` run.
func Build(d service.Deps, opts ...executor.Option) (*executor.Service, error) {
	getenv := d.Getenv
	if getenv == nil {
		getenv = d.WithDefaults().Getenv
	}
	cfg, err := executor.ConfigFromEnv(getenv)
	std, stdErr := ConfigFromEnv(getenv)
	if err := errors.Join(err, stdErr); err != nil {
		return nil, fmt.Errorf("executor configuration: %w", err)
	}
	return executor.New(d, cfg.With(WithConfig(std)).With(opts...))
}
