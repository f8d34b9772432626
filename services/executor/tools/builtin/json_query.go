package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/itchyny/gojq"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// json_query runs a jq expression over JSON input with github.com/itchyny/gojq
// (a pure-Go jq that runs under a context). The query sees only its input: no
// environment ($ENV is empty), no modules, no input/inputs. Its results are
// bounded in number and size, and its run is cancelled with the call.

const (
	// maxQueryResults bounds the values a query may emit ("range(1e9)").
	maxQueryResults = 10_000
	// maxQueryOutputBytes bounds the JSON of all results together.
	maxQueryOutputBytes = 8 << 20
)

type jsonQueryTool struct{}

type jsonQueryIn struct {
	Query string          `json:"query"`
	Input json.RawMessage `json:"input"`
}

func (jsonQueryTool) Definition() envelope.ToolDefinition {
	return toolapi.BuiltinDefinition("json_query",
		"Runs a jq expression over a JSON value and returns every value it emits, in order (for example "+
			`query ".items[] | select(.price < 10) | .name").`,
		envelope.CategoryData,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 65536, "description": "A jq expression."},
    "input": {"description": "The JSON value the expression runs on (any JSON; null when absent)."}
  },
  "required": ["query"],
  "additionalProperties": false
}`,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {"result": {"type": "array", "description": "The values the expression emitted, in order."}},
  "required": ["result"],
  "additionalProperties": false
}`)
}

func (jsonQueryTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	const name = "json_query"
	var in jsonQueryIn
	if err := toolapi.DecodeInput(name, input, &in); err != nil {
		return nil, err
	}
	q, err := gojq.Parse(in.Query)
	if err != nil {
		return nil, queryError(in.Query, err)
	}
	// No environment, modules or input iterator: the query sees its input only.
	code, err := gojq.Compile(q, gojq.WithEnvironLoader(func() []string { return nil }))
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "json_query: the query does not compile: %v", err)
	}
	var v any
	if len(in.Input) > 0 {
		dec := json.NewDecoder(bytes.NewReader(in.Input))
		dec.UseNumber() // keep big integers exact
		if err := dec.Decode(&v); err != nil {
			return nil, envelope.NewToolError(envelope.CodeValidation, "json_query: input is not JSON: %v", err)
		}
	}
	var out bytes.Buffer
	out.WriteString(`{"result":[`)
	iter := code.RunWithContext(ctx, v)
	for n := 0; ; n++ {
		r, ok := iter.Next()
		if !ok {
			break
		}
		if err, isErr := r.(error); isErr {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			var halt *gojq.HaltError
			if errors.As(err, &halt) && halt.Value() == nil {
				break // halt: stop without error
			}
			return nil, envelope.NewToolError(envelope.CodeValidation, "json_query: %v", err)
		}
		if n >= maxQueryResults {
			return nil, envelope.NewToolError(envelope.CodeValidation, "json_query: the query emitted more than %d values", maxQueryResults)
		}
		b, err := gojq.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("json_query: marshal a result: %w", err)
		}
		if out.Len()+len(b) > maxQueryOutputBytes {
			return nil, envelope.NewToolError(envelope.CodeValidation, "json_query: the results are larger than %d bytes", maxQueryOutputBytes)
		}
		if n > 0 {
			out.WriteByte(',')
		}
		out.Write(b)
	}
	out.WriteString(`]}`)
	return out.Bytes(), nil
}

// queryError reports a query that does not parse, pointing at the offset.
func queryError(query string, err error) *envelope.ToolError {
	var pe *gojq.ParseError
	if errors.As(err, &pe) {
		return envelope.NewToolError(envelope.CodeValidation, "json_query: the query does not parse: %v", err).
			WithDetails(map[string]any{"offset": pe.Offset, "token": pe.Token, "query": query})
	}
	return envelope.NewToolError(envelope.CodeValidation, "json_query: the query does not parse: %v", err)
}
