package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Tool is a tool the executor runs in process (implementation kind builtin).
//
// Execute receives the input exactly as the call carried it, already validated
// against the input schema of the registry entry being run. It must return
// when ctx ends (the tool's timeout or a shutdown). A failure the caller should
// see is returned as a *envelope.ToolError, whose code is kept; any other error
// becomes a generic UNKNOWN and is only logged.
type Tool interface {
	Definition() envelope.ToolDefinition
	Execute(ctx context.Context, input json.RawMessage, tc ToolContext) (json.RawMessage, error)
}

// ToolContext is what a tool learns about the call besides its input (spec
// 3.3).
type ToolContext struct {
	TenantID string
	RunID    string
	CallID   string
	// Auth holds the secrets resolved for this tool; never logged or traced.
	Auth map[string]string
	// Log is the call's logger, scrubbed of the values in Auth; nil means
	// the tool does not log.
	Log *slog.Logger
}

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

// builtinKey returns the key of the builtin that runs def: its config's
// "builtin", or the tool's name when the config is empty.
func builtinKey(def *envelope.ToolDefinition) (string, error) {
	if def.Implementation.Kind != envelope.ImplBuiltin {
		return "", fmt.Errorf("implementation kind %q is not builtin", def.Implementation.Kind)
	}
	if len(def.Implementation.Config) == 0 || string(def.Implementation.Config) == "null" {
		return def.Name, nil
	}
	var c BuiltinConfig
	if err := json.Unmarshal(def.Implementation.Config, &c); err != nil {
		return "", fmt.Errorf("builtin implementation config: %w", err)
	}
	if c.Builtin == "" {
		return def.Name, nil
	}
	return c.Builtin, nil
}
