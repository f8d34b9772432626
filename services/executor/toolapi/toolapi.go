// Package toolapi is what every tool the executor runs in process
// implements, and the helpers the tool families (package builtin, web,
// httptool, mcp, sandboxtool under services/executor/tools) share. It imports
// nothing of the executor's pipeline: the pipeline imports the tools, never
// the other way round.
package toolapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"

	fastjson "github.com/segmentio/encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Tool is a tool the executor runs in process: a built-in (implementation
// kind builtin) or the runner of a registry entry of another kind (an HTTP
// endpoint, an MCP server's tool, a sandbox job).
//
// Execute receives the input exactly as the call carried it, already validated
// against the input schema of the registry entry being run. It must return
// when ctx ends (the tool's timeout or a shutdown). A failure the caller should
// see is returned as a *envelope.ToolError, whose code is kept; any other error
// becomes a generic UNKNOWN and is only logged. Whatever it fails with once
// its timeout has passed, the call is TIMEOUT.
type Tool interface {
	Definition() envelope.ToolDefinition
	Execute(ctx context.Context, input json.RawMessage, tc Context) (json.RawMessage, error)
}

// Previewer is a Tool that can do a dry run: it tells what a call would do
// and changes nothing. Its definition declares supports_preview; the Policy
// Guard then asks for a preview when the call needs an operator's approval,
// and the approval request carries it. Preview gets the same input (already
// valid against the input schema) and the same Context as Execute, its
// output is scrubbed of secret values the same way, and it runs under the
// tool's timeout.
type Previewer interface {
	Preview(ctx context.Context, input json.RawMessage, tc Context) (json.RawMessage, error)
}

// Context is what a tool learns about the call besides its input
// (docs/architecture.md, Contracts: the tool definition).
type Context struct {
	TenantID string
	RunID    string
	CallID   string
	// Auth holds the secrets resolved for this tool; never logged or traced.
	Auth map[string]string
	// SecretDestinations are the bindings of the registry entry being run
	// (envelope.ToolDefinition.SecretDestinations): where each secret of
	// Auth may be sent. A web tool sends a secret nowhere else, and a secret
	// without a binding nowhere at all. Read-only.
	SecretDestinations map[string]envelope.SecretBinding
	// Log is the call's logger, scrubbed of the values in Auth; nil means
	// the tool does not log.
	Log *slog.Logger
	// Rerun, set for a writes tool that declares metadata.idempotent, is
	// asked by a tool that handed the call to another process (a worker)
	// and lost it with that process: true lets it hand the call over again,
	// under the same run and call ids (the idempotency key), as the call's
	// next run; false (no runs or time left) leaves the outcome unknown.
	Rerun func() bool
}

// BuiltinVersion is the version of every built-in tool.
const BuiltinVersion = "1.0.0"

// BuiltinConfig is the implementation config of a builtin registry entry: the
// key of the in-process Tool that runs it.
type BuiltinConfig struct {
	Builtin string `json:"builtin"`
}

// BuiltinImplementation returns the implementation of a registry entry run by
// the builtin with the given key.
func BuiltinImplementation(key string) envelope.Implementation {
	b, err := json.Marshal(BuiltinConfig{Builtin: key})
	if err != nil {
		panic(err) // a struct of one string always marshals
	}
	return envelope.Implementation{Kind: envelope.ImplBuiltin, Config: b}
}

// BuiltinKey returns the key of the builtin that runs def: its config's
// "builtin", or the tool's name when the config is empty.
func BuiltinKey(def *envelope.ToolDefinition) (string, error) {
	if def.Implementation.Kind != envelope.ImplBuiltin {
		return "", fmt.Errorf("implementation kind %q is not builtin", def.Implementation.Kind)
	}
	if len(def.Implementation.Config) == 0 || string(def.Implementation.Config) == "null" {
		return def.Name, nil
	}
	var c BuiltinConfig
	if err := unmarshal(def.Implementation.Config, &c); err != nil {
		return "", fmt.Errorf("builtin implementation config: %w", err)
	}
	if c.Builtin == "" {
		return def.Name, nil
	}
	return c.Builtin, nil
}

// BuiltinDefinition is the definition of a built-in tool: version
// BuiltinVersion, no side effects, not cached, run by the builtin of the same
// name. A tool with other metadata changes the fields it returns.
func BuiltinDefinition(name, description string, category envelope.Category, input, output string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name:         name,
		Version:      BuiltinVersion,
		Description:  description,
		InputSchema:  json.RawMessage(input),
		OutputSchema: json.RawMessage(output),
		Metadata: envelope.ToolMetadata{
			Category:    category,
			SideEffects: envelope.SideEffectsNone,
			Cache:       envelope.CacheNone,
		},
		Implementation: BuiltinImplementation(name),
	}
}

// DecodeInput unmarshals a tool's input; the executor has already checked it
// against the schema, so a failure here is a direct caller's mistake.
func DecodeInput(name string, input json.RawMessage, v any) error {
	if err := unmarshal(input, v); err != nil {
		return envelope.NewToolError(envelope.CodeValidation, "%s: input is not the expected object: %v", name, err)
	}
	return nil
}

// unmarshal is json.Unmarshal at a fraction of its cost: segmentio's decoder
// reads what encoding/json reads, into the same values, in a third of the
// time (a no-op tool's call spent more decoding its input than running).
// Input it refuses is decoded again by encoding/json, into a zeroed v, whose
// result and error stand. FuzzUnmarshal holds the two to the same values.
func unmarshal(data []byte, v any) error {
	if rest, err := fastjson.Parse(data, v, 0); err == nil && len(bytes.TrimLeft(rest, " \t\r\n")) == 0 {
		return nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero() // nothing of the refused attempt stays
	}
	return json.Unmarshal(data, v)
}
