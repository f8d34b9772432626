package orchestrator

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Helpers the provider adapters share to move between toolwire's neutral
// messages and the providers' wire formats.

// inputSchemaObject is a tool's input schema as the JSON object providers
// want for a function's parameters. A missing or boolean schema becomes an
// object schema without properties.
func inputSchemaObject(d envelope.ToolDefinition) (map[string]any, error) {
	raw := bytes.TrimSpace(d.InputSchema)
	if len(raw) == 0 || raw[0] != '{' {
		return map[string]any{"type": "object", "properties": map[string]any{}}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("tool %s: input_schema: %w", d.Ref(), err)
	}
	// Identification, not constraints: the providers need neither.
	delete(m, "$schema")
	delete(m, "$id")
	return m, nil
}

// argumentsJSON turns the arguments a model wrote into JSON: valid JSON as it
// is, nothing as {}, anything else as a JSON string of the text (which no
// object schema accepts, so the model is told what was wrong with it).
func argumentsJSON(text string) json.RawMessage {
	b := bytes.TrimSpace([]byte(text))
	switch {
	case len(b) == 0:
		return json.RawMessage(`{}`)
	case json.Valid(b):
		return json.RawMessage(b)
	}
	q, _ := json.Marshal(text)
	return q
}

// argumentsText is the inverse of argumentsJSON for a provider that wants
// the arguments as text: a JSON string is the model's broken text, given back
// as it wrote it.
func argumentsText(args json.RawMessage) string {
	b := bytes.TrimSpace(args)
	if len(b) == 0 {
		return "{}"
	}
	if b[0] == '"' {
		var s string
		if json.Unmarshal(b, &s) == nil {
			return s
		}
	}
	return string(b)
}

// argumentsValue is the arguments as a JSON value for a provider that wants
// an object (Anthropic's tool_use input): the model's broken text becomes an
// empty object, as no JSON object can carry it.
func argumentsValue(args json.RawMessage) any {
	b := bytes.TrimSpace(args)
	if len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return map[string]any{}
	}
	return json.RawMessage(b)
}

// providerCallID is the provider's id of a tool call, or a stable one when a
// compatible server sent none, so that results pair with their calls.
func providerCallID(id string, iteration, index int) string {
	if id != "" {
		return id
	}
	return fmt.Sprintf("call_%d_%d", iteration, index+1)
}
