package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Helpers the adapters share to move between toolwire's neutral messages and
// the providers' wire formats.

// DefaultRetries is how often an adapter retries a failed request when its
// configuration says 0.
const DefaultRetries = 3

// Retries is the number of retries a MaxRetries setting asks for: 0 means
// DefaultRetries, a negative number none.
func Retries(maxRetries int) int {
	switch {
	case maxRetries < 0:
		return 0
	case maxRetries == 0:
		return DefaultRetries
	}
	return maxRetries
}

// InputSchema is a tool's input schema as the JSON object providers want for
// a function's parameters. A missing or boolean schema becomes an object
// schema without properties.
func InputSchema(d envelope.ToolDefinition) (map[string]any, error) {
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

// ArgumentsJSON turns the arguments a model wrote into JSON: valid JSON as it
// is, nothing as {}, anything else as a JSON string of the text (which no
// object schema accepts, so the model is told what was wrong with it).
func ArgumentsJSON(text string) json.RawMessage {
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

// ArgumentsText is the inverse of ArgumentsJSON for a provider that wants
// the arguments as text: a JSON string is the model's broken text, given back
// as it wrote it.
func ArgumentsText(args json.RawMessage) string {
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

// ArgumentsValue is the arguments as a JSON value for a provider that wants
// an object (Anthropic's tool_use input): the model's broken text becomes an
// empty object, as no JSON object can carry it.
func ArgumentsValue(args json.RawMessage) any {
	b := bytes.TrimSpace(args)
	if len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return map[string]any{}
	}
	return json.RawMessage(b)
}

// CallID is the provider's id of a tool call, or a stable one when a
// compatible server sent none, so that results pair with their calls.
func CallID(id string, iteration, index int) string {
	if id != "" {
		return id
	}
	return fmt.Sprintf("call_%d_%d", iteration, index+1)
}

// apiKeyLike matches what looks like an API key in a provider's error
// message ("Incorrect API key provided: sk-proj-****abcd").
var apiKeyLike = regexp.MustCompile(`\b(?:sk|key)-[A-Za-z0-9_*\-]{4,}`)

// RedactKeys hides anything that looks like an API key: a provider's error
// message becomes a run's failure reason.
func RedactKeys(s string) string { return apiKeyLike.ReplaceAllString(s, "[redacted]") }

// Failure says which provider and model failed, after how many attempts, and
// why (the SDK's error: status, and what the body says), with anything that
// looks like an API key hidden. It unwraps to err.
func Failure(provider, model string, attempts int, err error) error {
	msg := fmt.Sprintf("%s model %s failed: %v", provider, model, err)
	if attempts > 1 {
		msg = fmt.Sprintf("%s model %s failed after %d attempts: %v", provider, model, attempts, err)
	}
	return &failure{msg: RedactKeys(msg), err: err}
}

// failure is a model call's failure; it unwraps to the SDK's error.
type failure struct {
	msg string
	err error
}

func (e *failure) Error() string { return e.msg }
func (e *failure) Unwrap() error { return e.err }
