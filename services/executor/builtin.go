package executor

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	// The IANA time zone database, compiled in, so that get_current_time
	// answers the same on a host (or a distroless image) without tzdata.
	_ "time/tzdata"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// BuiltinVersion is the version of every built-in tool.
const BuiltinVersion = "1.0.0"

// Builtins returns the executor's built-in tools: echo, calculator,
// get_current_time, failing and sleep.
func Builtins() []Tool {
	return []Tool{echoTool{}, calculatorTool{}, currentTimeTool{now: time.Now}, failingTool{}, sleepTool{}}
}

// builtinDefinition is the definition of a built-in tool: version 1.0.0, no
// side effects, not cached, run by the builtin of the same name.
func builtinDefinition(name, description string, category envelope.Category, input, output string) envelope.ToolDefinition {
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

// decodeInput unmarshals a tool's input; the executor has already checked it
// against the schema, so a failure here is a direct caller's mistake.
func decodeInput(name string, input json.RawMessage, v any) error {
	if err := json.Unmarshal(input, v); err != nil {
		return envelope.NewToolError(envelope.CodeValidation, "%s: input is not the expected object: %v", name, err)
	}
	return nil
}

// --- echo -----------------------------------------------------------------

type echoTool struct{}

type echoIO struct {
	Text string `json:"text"`
}

func (echoTool) Definition() envelope.ToolDefinition {
	return builtinDefinition("echo", "Returns the given text unchanged.", envelope.CategoryUtility,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"text": {"type": "string", "description": "The text to return."}},
  "required": ["text"],
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"text": {"type": "string"}},
  "required": ["text"],
  "additionalProperties": false
}`)
}

func (echoTool) Execute(_ context.Context, input json.RawMessage, _ ToolContext) (json.RawMessage, error) {
	var in echoIO
	if err := decodeInput("echo", input, &in); err != nil {
		return nil, err
	}
	return json.Marshal(in)
}

// --- get_current_time ---------------------------------------------------------

// Formats of get_current_time.
const (
	timeFormatISO   = "iso8601"
	timeFormatUnix  = "unix"
	timeFormatHuman = "human"
	humanLayout     = "Monday, 2 January 2006 15:04:05 MST"
)

type currentTimeTool struct{ now func() time.Time }

type currentTimeIn struct {
	Format   string `json:"format"`
	Timezone string `json:"timezone"`
}

type currentTimeOut struct {
	Time     string `json:"time"`
	Timezone string `json:"timezone"`
	Unix     int64  `json:"unix"`
}

func (currentTimeTool) Definition() envelope.ToolDefinition {
	return builtinDefinition("get_current_time",
		"Returns the current time in a time zone (IANA name, default UTC) as ISO 8601, Unix seconds or a human-readable string.",
		envelope.CategoryUtility,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "format": {"type": "string", "enum": ["iso8601", "unix", "human"], "default": "iso8601",
      "description": "How to write the time."},
    "timezone": {"type": "string", "minLength": 1, "maxLength": 64, "default": "UTC",
      "description": "IANA time zone name, for example Europe/Paris."}
  },
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "time": {"type": "string"},
    "timezone": {"type": "string"},
    "unix": {"type": "integer"}
  },
  "required": ["time", "timezone", "unix"],
  "additionalProperties": false
}`)
}

func (t currentTimeTool) Execute(_ context.Context, input json.RawMessage, _ ToolContext) (json.RawMessage, error) {
	var in currentTimeIn
	if err := decodeInput("get_current_time", input, &in); err != nil {
		return nil, err
	}
	if in.Timezone == "" {
		in.Timezone = "UTC"
	}
	// "Local" names the host's zone, not an IANA zone: refuse it rather than
	// leak the executor's configuration.
	if in.Timezone == "Local" {
		return nil, envelope.NewToolError(envelope.CodeValidation, "get_current_time: unknown timezone %q: want an IANA name such as Europe/Paris", in.Timezone)
	}
	loc, err := time.LoadLocation(in.Timezone)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "get_current_time: unknown timezone %q: want an IANA name such as Europe/Paris", in.Timezone)
	}
	now := t.now().In(loc)
	out := currentTimeOut{Timezone: loc.String(), Unix: now.Unix()}
	switch in.Format {
	case "", timeFormatISO:
		out.Time = now.Format(time.RFC3339)
	case timeFormatUnix:
		out.Time = strconv.FormatInt(now.Unix(), 10)
	case timeFormatHuman:
		out.Time = now.Format(humanLayout)
	default:
		return nil, envelope.NewToolError(envelope.CodeValidation, "get_current_time: format %q is not one of iso8601, unix, human", in.Format)
	}
	return json.Marshal(out)
}

// --- failing ----------------------------------------------------------------

const defaultFailingMessage = "the failing tool failed, as it always does"

type failingTool struct{}

type failingIn struct {
	Message string `json:"message"`
}

func (failingTool) Definition() envelope.ToolDefinition {
	return builtinDefinition("failing",
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

func (failingTool) Execute(_ context.Context, input json.RawMessage, _ ToolContext) (json.RawMessage, error) {
	var in failingIn
	if err := decodeInput("failing", input, &in); err != nil {
		return nil, err
	}
	msg := strings.TrimSpace(in.Message)
	if msg == "" {
		msg = defaultFailingMessage
	}
	return nil, &envelope.ToolError{Code: envelope.CodeProviderError, Message: msg}
}

// --- sleep ------------------------------------------------------------------

// sleepTimeoutMS is the sleep tool's timeout: sleeps longer than this end in
// TIMEOUT.
const sleepTimeoutMS = 120_000

type sleepTool struct{}

type sleepIn struct {
	MS int64 `json:"ms"`
}

type sleepOut struct {
	SleptMS int64 `json:"slept_ms"`
}

func (sleepTool) Definition() envelope.ToolDefinition {
	d := builtinDefinition("sleep",
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
	d.TimeoutMS = sleepTimeoutMS
	return d
}

func (sleepTool) Execute(ctx context.Context, input json.RawMessage, _ ToolContext) (json.RawMessage, error) {
	var in sleepIn
	if err := decodeInput("sleep", input, &in); err != nil {
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
