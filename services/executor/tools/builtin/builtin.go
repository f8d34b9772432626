// Package builtin holds the executor's built-in tools that reach nothing
// outside the process: echo, calculator, get_current_time and json_query.
package builtin

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	// The IANA time zone database, compiled in, so that get_current_time
	// answers the same on a host (or a distroless image) without tzdata.
	_ "time/tzdata"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Tools returns the built-in tools every executor runs: echo, calculator,
// get_current_time and json_query. They reach nothing outside the process.
func Tools() []toolapi.Tool {
	return []toolapi.Tool{echoTool{}, calculatorTool{}, currentTimeTool{now: time.Now}, jsonQueryTool{}}
}

// --- echo -----------------------------------------------------------------

type echoTool struct{}

type echoIO struct {
	Text string `json:"text"`
}

func (echoTool) Definition() envelope.ToolDefinition {
	return toolapi.BuiltinDefinition("echo", "Returns the given text unchanged.", envelope.CategoryUtility,
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

func (echoTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in echoIO
	if err := toolapi.DecodeInput("echo", input, &in); err != nil {
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
	return toolapi.BuiltinDefinition("get_current_time",
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

func (t currentTimeTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in currentTimeIn
	if err := toolapi.DecodeInput("get_current_time", input, &in); err != nil {
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
