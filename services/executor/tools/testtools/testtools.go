// Package testtools holds tools for tests and benchmarks, never registered by
// a production executor: failing (always PROVIDER_ERROR) and sleep (waits,
// for timeouts and parallelism). A test gives them to an executor with
// executor.WithTools(testtools.Tools()...).
package testtools

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Tools returns failing and sleep.
func Tools() []toolapi.Tool { return []toolapi.Tool{Failing(), Sleep()} }

// Failing returns failing@1.0.0: it always fails with PROVIDER_ERROR and the
// message of its input.
func Failing() toolapi.Tool { return failingTool{} }

// Sleep returns sleep@1.0.0: it waits the milliseconds of its input.
func Sleep() toolapi.Tool { return sleepTool{} }

// --- failing ----------------------------------------------------------------

// DefaultFailingMessage is the message of a failing call that gives none.
const DefaultFailingMessage = "the failing tool failed, as it always does"

type failingTool struct{}

type failingIn struct {
	Message string `json:"message"`
}

func (failingTool) Definition() envelope.ToolDefinition {
	return toolapi.BuiltinDefinition("failing",
		"A test tool: always fails with PROVIDER_ERROR and the given message.",
		envelope.CategoryUtility,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"message": {"type": "string", "maxLength": 1024, "description": "The error message to fail with."}},
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "description": "The tool never succeeds.",
  "not": {}
}`)
}

func (failingTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in failingIn
	if err := toolapi.DecodeInput("failing", input, &in); err != nil {
		return nil, err
	}
	msg := strings.TrimSpace(in.Message)
	if msg == "" {
		msg = DefaultFailingMessage
	}
	return nil, &envelope.ToolError{Code: envelope.CodeProviderError, Message: msg}
}

// --- sleep ------------------------------------------------------------------

// SleepTimeoutMS is the sleep tool's timeout: sleeps longer than this end in
// TIMEOUT.
const SleepTimeoutMS = 120_000

type sleepTool struct{}

type sleepIn struct {
	MS int64 `json:"ms"`
}

type sleepOut struct {
	SleptMS int64 `json:"slept_ms"`
}

func (sleepTool) Definition() envelope.ToolDefinition {
	d := toolapi.BuiltinDefinition("sleep",
		"Waits the given number of milliseconds, then returns. For tests of timeouts and parallelism.",
		envelope.CategoryUtility,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 600000, "description": "Milliseconds to wait."}},
  "required": ["ms"],
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"slept_ms": {"type": "integer", "minimum": 0}},
  "required": ["slept_ms"],
  "additionalProperties": false
}`)
	d.TimeoutMS = SleepTimeoutMS
	return d
}

func (sleepTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in sleepIn
	if err := toolapi.DecodeInput("sleep", input, &in); err != nil {
		return nil, err
	}
	if in.MS < 0 {
		return nil, envelope.NewToolError(envelope.CodeValidation, "sleep: ms must not be negative")
	}
	t := time.NewTimer(time.Duration(in.MS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return json.Marshal(sleepOut{SleptMS: in.MS})
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
