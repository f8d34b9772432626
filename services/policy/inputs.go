package policy

import (
	"bytes"
	"net/url"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

// RuleInput is the rule that denies a call awaiting approval whose input
// does not match its tool's input schema: the executor would refuse it, so
// an operator is never asked to approve it.
const RuleInput = "input"

// inputSchemas compiles each tool version's input schema once (again only
// when the registry changes the version's schema document), for the calls
// that wait for approval.
type inputSchemas struct {
	mu sync.Mutex
	m  map[string]compiledInput
}

type compiledInput struct {
	doc []byte
	sch *jsonschema.Schema
	err error
}

func newInputSchemas() *inputSchemas { return &inputSchemas{m: map[string]compiledInput{}} }

func (c *inputSchemas) get(def *envelope.ToolDefinition) (*jsonschema.Schema, error) {
	key := def.Ref().String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if ci, ok := c.m[key]; ok && bytes.Equal(ci.doc, def.InputSchema) {
		return ci.sch, ci.err
	}
	// The URL the executor compiles it under (services/executor/toolapi/schemas.go).
	base := "https://toolwire.dev/tools/" + url.PathEscape(def.Name) + "/" + url.PathEscape(def.Version)
	sch, err := envelope.CompileToolSchema(base+"/input.schema.json", def.InputSchema)
	c.m[key] = compiledInput{doc: bytes.Clone(def.InputSchema), sch: sch, err: err}
	return sch, err
}

// checkInput is the decision on a call's input before it is held for
// approval: allowed when it matches the tool's input schema, else denied
// with VALIDATION_ERROR and the schema's problems, as the executor would
// answer it (services/executor/call.go); a schema that does not compile is
// UNKNOWN, as there.
func (c *inputSchemas) checkInput(def *envelope.ToolDefinition, input []byte) rules.Decision {
	ref := def.Ref()
	sch, err := c.get(def)
	if err != nil {
		return rules.Decision{Code: envelope.CodeUnknown, Rule: RuleInput,
			Reason: "tool " + ref.String() + " has an invalid JSON Schema in the registry"}
	}
	if err := envelope.ValidateAgainst(ref.String()+" input", sch, input); err != nil {
		d := rules.Decision{Code: envelope.CodeValidation, Rule: RuleInput,
			Reason: "input for tool " + ref.String() + " does not match its input schema"}
		if se, ok := err.(*envelope.SchemaError); ok { //nolint:errorlint // ValidateAgainst returns it unwrapped
			d.Details = se.Problems
		} else {
			d.Details = []string{err.Error()}
		}
		return d
	}
	return rules.Allow()
}
