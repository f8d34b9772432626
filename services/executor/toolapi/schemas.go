package toolapi

import (
	"net/url"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Schemas are the compiled schemas of one tool definition.
type Schemas struct {
	Input *jsonschema.Schema
	// Output is nil when the tool declares no output schema.
	Output *jsonschema.Schema
}

// CompileSchemas compiles def's input and output schemas as the executor
// checks calls against them; an error says that they do not compile (a tool
// registration must not store such a definition).
func CompileSchemas(def *envelope.ToolDefinition) (*Schemas, error) {
	base := "https://toolwire.dev/tools/" + url.PathEscape(def.Name) + "/" + url.PathEscape(def.Version)
	in, err := envelope.CompileToolSchema(base+"/input.schema.json", def.InputSchema)
	if err != nil {
		return nil, err
	}
	s := &Schemas{Input: in}
	if len(def.OutputSchema) == 0 {
		return s, nil
	}
	if s.Output, err = envelope.CompileToolSchema(base+"/output.schema.json", def.OutputSchema); err != nil {
		return nil, err
	}
	return s, nil
}
