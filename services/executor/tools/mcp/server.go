// Package mcp runs the registry entries of kind mcp: the tools of MCP
// servers, called through the official Go SDK
// (github.com/modelcontextprotocol/go-sdk). It also registers a server's
// tools in the registry (RegisterServer; the CLI: toolwire tools mcp add).
package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/mattn/go-shellwords"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// MCP servers' tools in the registry.
//
// An operator registers an MCP server, a command the executor runs and talks
// to over stdio or a streamable HTTP endpoint, with RegisterServer (the
// CLI: toolwire tools mcp add). Each of its tools becomes a registry entry
// "<server>_<tool>@<version>" with the tool's input schema (and output schema
// when it declares one) and the implementation
//
//	{"kind": "mcp", "config": {"server": NAME, "transport": "stdio"|"http",
//	  "command": ..., "args": [...] | "url": ..., "tool": ORIGINAL_NAME}}
//
// The executor runs such entries by calling the server through the official
// Go SDK, github.com/modelcontextprotocol/go-sdk (see Pool).
//
// Whoever may write the registry may make executors run a stdio command:
// registry write access is operator access. The command runs without a
// shell, with a minimal environment (PATH, HOME, LANG, TMPDIR), never the
// executor's own (which may hold the secrets' master key).

// Transport is how the executor reaches an MCP server.
type Transport string

// MCP transports.
const (
	// Stdio runs a command and speaks MCP over its stdin and stdout.
	Stdio Transport = "stdio"
	// HTTP speaks MCP's streamable HTTP transport to a URL.
	HTTP Transport = "http"
)

// DefaultToolVersion is the version an MCP server's tools get unless the
// operator gives one.
const DefaultToolVersion = "1.0.0"

// serverNameRE: a server's name prefixes its tools' names.
var serverNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Server is an MCP server as an operator registers it.
type Server struct {
	// Name names the server; it prefixes its tools' names. 1-32 letters,
	// digits, '_' or '-'.
	Name      string
	Transport Transport
	// Command and Args start a stdio server (no shell is involved).
	Command string
	Args    []string
	// URL is a streamable HTTP server's endpoint.
	URL string
}

// Validate checks the server's fields.
func (s Server) Validate() error {
	var errs []error
	if !serverNameRE.MatchString(s.Name) {
		errs = append(errs, fmt.Errorf("MCP server name %q: want 1-32 letters, digits, '_' or '-'", s.Name))
	}
	switch s.Transport {
	case Stdio:
		if strings.TrimSpace(s.Command) == "" {
			errs = append(errs, errors.New("a stdio MCP server needs a command"))
		}
		if s.URL != "" {
			errs = append(errs, errors.New("a stdio MCP server has no url"))
		}
	case HTTP:
		u, err := url.Parse(s.URL)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("MCP server url %q: %w", s.URL, err))
		case u.Scheme != "http" && u.Scheme != "https":
			errs = append(errs, fmt.Errorf("MCP server url %q: scheme must be http or https", s.URL))
		case u.Host == "":
			errs = append(errs, fmt.Errorf("MCP server url %q: no host", s.URL))
		}
		if s.Command != "" || len(s.Args) > 0 {
			errs = append(errs, errors.New("an http MCP server has no command"))
		}
	default:
		errs = append(errs, fmt.Errorf("MCP transport %q is not one of stdio, http", s.Transport))
	}
	for _, a := range append([]string{s.Command}, s.Args...) {
		if strings.ContainsRune(a, 0) {
			errs = append(errs, errors.New("the command holds a NUL byte"))
			break
		}
	}
	return errors.Join(errs...)
}

// String describes the server for messages.
func (s Server) String() string {
	if s.Transport == HTTP {
		return fmt.Sprintf("MCP server %s (%s)", s.Name, s.URL)
	}
	return fmt.Sprintf("MCP server %s (%s)", s.Name, strings.Join(append([]string{s.Command}, s.Args...), " "))
}

// key identifies the connection: entries with the same server settings share
// one session.
func (s Server) key() string {
	b, _ := json.Marshal([]any{s.Name, s.Transport, s.Command, s.Args, s.URL})
	return string(b)
}

// Config is the implementation config of a registry entry of kind mcp.
type Config struct {
	Server    string    `json:"server"`
	Transport Transport `json:"transport"`
	Command   string    `json:"command,omitempty"`
	Args      []string  `json:"args,omitempty"`
	URL       string    `json:"url,omitempty"`
	// Tool is the tool's name on the server.
	Tool string `json:"tool"`
}

// Target returns the server the entry names.
func (c Config) Target() Server {
	return Server{Name: c.Server, Transport: c.Transport, Command: c.Command, Args: c.Args, URL: c.URL}
}

// Validate checks the config.
func (c Config) Validate() error {
	err := c.Target().Validate()
	if strings.TrimSpace(c.Tool) == "" {
		err = errors.Join(err, errors.New("no tool name"))
	}
	return err
}

// Implementation returns the implementation of a registry entry run by
// the MCP server's tool.
func Implementation(c Config) envelope.Implementation {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // strings and a string slice always marshal
	}
	return envelope.Implementation{Kind: envelope.ImplMCP, Config: b}
}

// ParseConfig reads and checks an entry's MCP config.
func ParseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("mcp implementation config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("mcp implementation config: %w", err)
	}
	return c, nil
}

// RegisterOptions shape the registry entries of an MCP server's tools.
type RegisterOptions struct {
	// Version of every tool; default 1.0.0.
	Version string
	// BareNames names each entry after the tool alone (when that is a valid
	// tool name) instead of "<server>_<tool>".
	BareNames bool
	// Category of every tool; default api.
	Category envelope.Category
	// SideEffects of every tool; "" reads each tool's annotations: reads
	// when it says readOnlyHint, writes otherwise (the MCP default).
	SideEffects envelope.SideEffects
	// TimeoutMS of every tool; 0 is the executor's default.
	TimeoutMS int
	// By is who registers (recorded in each entry written).
	By string
}

// Validate checks the options' values, before anything connects; field
// names the option of each message (a flag, a form's field).
func (o RegisterOptions) Validate(field func(option string) string) error {
	var errs []error
	if o.Version != "" {
		if err := (envelope.ToolRef{Name: "x", Version: o.Version}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want a semantic version like 1.0.0", field("version"), o.Version))
		}
	}
	switch o.Category {
	case "", envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility:
	default:
		errs = append(errs, fmt.Errorf("%s %q: want api, code, data, search or utility", field("category"), o.Category))
	}
	if o.SideEffects != "" && o.SideEffects.Rank() < 0 {
		errs = append(errs, fmt.Errorf("%s %q: want none, reads or writes", field("side-effects"), o.SideEffects))
	}
	if o.TimeoutMS < 0 {
		errs = append(errs, fmt.Errorf("%s: want a positive duration", field("tool-timeout")))
	}
	return errors.Join(errs...)
}

// ParseServer is the server named name at command (a stdio server: the
// program and its arguments, split as a shell would split them: quotes and
// backslashes, no variables, globs or substitutions) or at url (a
// streamable HTTP endpoint): exactly one of the two. field names the
// option of each message.
func ParseServer(name, command, url string, field func(option string) string) (Server, error) {
	command, url = strings.TrimSpace(command), strings.TrimSpace(url)
	switch {
	case command != "" && url != "":
		return Server{}, fmt.Errorf("give either %s or %s, not both", field("command"), field("url"))
	case command == "" && url == "":
		return Server{}, fmt.Errorf("give the server: %s for a stdio server or %s for an HTTP one", field("command"), field("url"))
	}
	srv := Server{Name: name, Transport: HTTP, URL: url}
	if command != "" {
		p := shellwords.NewParser()
		p.ParseEnv, p.ParseBacktick = false, false
		words, err := p.Parse(command)
		if err != nil {
			return srv, fmt.Errorf("%s %q: %w", field("command"), command, err)
		}
		if len(words) == 0 {
			return srv, fmt.Errorf("%s %q names no program", field("command"), command)
		}
		srv = Server{Name: name, Transport: Stdio, Command: words[0], Args: words[1:]}
	}
	return srv, srv.Validate()
}

// Registration is what registering a server did.
type Registration struct {
	// Tools are the definitions written, sorted by name.
	Tools []envelope.ToolDefinition
	// Skipped says which of the server's tools were not registered and why.
	Skipped []string
}

// ToolDefinitions connects to the server, lists its tools and returns
// their registry definitions (without writing them).
func ToolDefinitions(ctx context.Context, srv Server, opts RegisterOptions) (Registration, error) {
	if err := srv.Validate(); err != nil {
		return Registration{}, err
	}
	if opts.Version == "" {
		opts.Version = DefaultToolVersion
	}
	if opts.Category == "" {
		opts.Category = envelope.CategoryAPI
	}
	if err := (envelope.ToolRef{Name: "x", Version: opts.Version}).Validate(); err != nil {
		return Registration{}, err
	}
	pool := NewPool(ctx, nil, nil)
	defer pool.Close()
	cs, err := pool.session(ctx, srv)
	if err != nil {
		return Registration{}, err
	}
	var tools []*sdk.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return Registration{}, fmt.Errorf("%s: list tools: %w", srv, err)
		}
		tools = append(tools, t)
	}
	var reg Registration
	seen := map[string]string{}
	for _, t := range tools {
		def, err := definition(srv, t, opts)
		if err != nil {
			reg.Skipped = append(reg.Skipped, fmt.Sprintf("%s: %v", t.Name, err))
			continue
		}
		if prev, dup := seen[def.Name]; dup {
			reg.Skipped = append(reg.Skipped, fmt.Sprintf("%s: its registry name %s is taken by %s", t.Name, def.Name, prev))
			continue
		}
		seen[def.Name] = t.Name
		reg.Tools = append(reg.Tools, def)
	}
	sort.Slice(reg.Tools, func(i, j int) bool { return reg.Tools[i].Name < reg.Tools[j].Name })
	return reg, nil
}

// RegisterServer connects to the server, lists its tools and writes a
// registry entry for each (replacing the entries of an earlier registration
// of the same names and version; their lifecycle state is kept).
func RegisterServer(ctx context.Context, reg *registry.Registry, srv Server, opts RegisterOptions) (Registration, error) {
	r, err := ToolDefinitions(ctx, srv, opts)
	if err != nil {
		return r, err
	}
	for _, def := range r.Tools {
		if err := reg.EnsureAs(ctx, def, opts.By); err != nil {
			return r, fmt.Errorf("register %s: %w", def.Ref(), err)
		}
	}
	return r, nil
}

// definition builds the registry definition of one MCP tool.
func definition(srv Server, t *sdk.Tool, opts RegisterOptions) (envelope.ToolDefinition, error) {
	if t.Name == "" {
		return envelope.ToolDefinition{}, errors.New("the tool has no name")
	}
	in, err := schemaJSON(t.InputSchema)
	if err != nil {
		return envelope.ToolDefinition{}, fmt.Errorf("input schema: %w", err)
	}
	if in == nil {
		in = json.RawMessage(`{"type":"object"}`)
	}
	out, err := schemaJSON(t.OutputSchema)
	if err != nil {
		return envelope.ToolDefinition{}, fmt.Errorf("output schema: %w", err)
	}
	side := opts.SideEffects
	if side == "" {
		side = envelope.SideEffectsWrites
		if t.Annotations != nil && t.Annotations.ReadOnlyHint {
			side = envelope.SideEffectsReads
		}
	}
	desc := t.Description
	if desc == "" && t.Title != "" {
		desc = t.Title
	}
	def := envelope.ToolDefinition{
		Name:         toolName(srv.Name, t.Name, opts.BareNames),
		Version:      opts.Version,
		Description:  desc,
		InputSchema:  in,
		OutputSchema: out,
		Metadata: envelope.ToolMetadata{
			Category:    opts.Category,
			SideEffects: side,
			Cache:       envelope.CacheNone,
		},
		TimeoutMS: opts.TimeoutMS,
		Implementation: Implementation(Config{
			Server: srv.Name, Transport: srv.Transport, Command: srv.Command, Args: srv.Args, URL: srv.URL, Tool: t.Name,
		}),
	}
	if err := def.Validate(); err != nil {
		return envelope.ToolDefinition{}, err
	}
	// Compiled as the executor will, so that a registration never stores a
	// definition that cannot run.
	if _, err := toolapi.CompileSchemas(&def); err != nil {
		return envelope.ToolDefinition{}, err
	}
	return def, nil
}

// schemaJSON marshals a schema the SDK decoded (nil stays nil).
func schemaJSON(s any) (json.RawMessage, error) {
	if s == nil {
		return nil, nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if string(b) == "null" {
		return nil, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, errors.New("not a JSON object")
	}
	return b, nil
}

// invalidToolNameChars are what a tool name may not hold.
var invalidToolNameChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// toolName is the registry name of a server's tool: "<server>_<tool>" (or
// the tool's name alone), other characters replaced by '_', and cut to 64
// with a hash of the whole when longer.
func toolName(server, tool string, bare bool) string {
	name := server + "_" + tool
	if bare {
		name = tool
	}
	clean := invalidToolNameChars.ReplaceAllString(name, "_")
	if len(clean) <= 64 && clean != "" {
		return clean
	}
	sum := sha256.Sum256([]byte(name))
	return clean[:55] + "_" + hex.EncodeToString(sum[:])[:8]
}
