package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// How the agent node tells the model to use its tools, and what its final
// answer must be: the fields of Agent that configure the model side
// (docs/agent-loop.md: The model side).

// Tool choices of Agent.ToolChoice besides the name of an enabled tool.
const (
	ToolChoiceAuto     = "auto"     // the model decides (the default)
	ToolChoiceRequired = "required" // the first answer must call a tool
	ToolChoiceNone     = "none"     // no answer calls a tool
)

// DefaultOutputRetries is how often a final answer that fails
// Agent.OutputSchema goes back to the model, when the agent says 0.
const DefaultOutputRetries = 2

// MaxOutputRetries bounds Agent.OutputRetries.
const MaxOutputRetries = 5

// OutputRetriesOr is the agent's retries of a final answer that fails its
// output schema: OutputRetries, DefaultOutputRetries for 0, none for -1.
func (a Agent) OutputRetriesOr() int {
	switch {
	case a.OutputRetries < 0:
		return 0
	case a.OutputRetries == 0:
		return DefaultOutputRetries
	}
	return a.OutputRetries
}

// ToolChoiceAt is the tool choice of model call n (from 1): the agent's for
// the first call; after it, "none" stays "none" and any other is "auto", so
// that a required or named tool is called once and the model can then
// answer (as the OpenAI Agents SDK resets its tool_choice).
func (a Agent) ToolChoiceAt(n int) string {
	c := a.ToolChoice
	switch {
	case c == "":
		return ToolChoiceAuto
	case n > 1 && c != ToolChoiceNone:
		return ToolChoiceAuto
	}
	return c
}

// StopsAt says whether a successful call of the tool named name ends the
// run, its output the answer (Agent.StopAtTools).
func (a Agent) StopsAt(name string) bool { return slices.Contains(a.StopAtTools, name) }

// modelSideProblems are what is wrong with the model-side fields, given the
// names of the enabled tools.
func (a Agent) modelSideProblems(enabled map[string]string) []string {
	var out []string
	switch c := a.ToolChoice; c {
	case "", ToolChoiceAuto, ToolChoiceRequired, ToolChoiceNone:
		if c == ToolChoiceRequired && len(enabled) == 0 {
			out = append(out, `agent.tool_choice "required" needs an enabled tool`)
		}
	default:
		if _, ok := enabled[c]; !ok {
			out = append(out, fmt.Sprintf("agent.tool_choice %q is not auto, required, none or the name of an enabled tool", truncateForError(c)))
		}
	}
	for i, name := range a.StopAtTools {
		if _, ok := enabled[name]; !ok {
			out = append(out, fmt.Sprintf("agent.stop_at_tools[%d] %q is not the name of an enabled tool", i, truncateForError(name)))
		}
	}
	if len(a.StopAtTools) > 0 && a.ToolChoice == ToolChoiceNone {
		out = append(out, `agent.stop_at_tools needs tool calls, which agent.tool_choice "none" forbids`)
	}
	if a.OutputRetries < -1 || a.OutputRetries > MaxOutputRetries {
		out = append(out, fmt.Sprintf("agent.output_retries %d must be -1 (none) to %d (0: %d)", a.OutputRetries, MaxOutputRetries, DefaultOutputRetries))
	}
	if len(a.OutputSchema) > 0 {
		if _, err := a.CompileOutputSchema(); err != nil {
			out = append(out, "agent.output_schema: "+err.Error())
		}
		if len(a.StopAtTools) > 0 {
			out = append(out, "agent.output_schema and agent.stop_at_tools both say what the answer is: set one")
		}
		if _, ok := enabled[OutputToolName]; ok {
			out = append(out, "agent.output_schema: the tool "+OutputToolName+" is enabled, and that name carries the final answer to providers without a native structured output")
		}
	}
	return out
}

// OutputToolName is the name under which a provider without a native
// structured-output mode is offered the final answer as a tool (its input
// the answer): an agent with an output schema cannot enable a tool so named.
const OutputToolName = "final_output"

// OutputSchemaURL is the synthetic URL an agent's output schema compiles
// under.
const OutputSchemaURL = "urn:toolwire:agent:output_schema"

// CompileOutputSchema compiles Agent.OutputSchema as a tool's schema is
// compiled (CompileToolSchema); nil without one.
func (a Agent) CompileOutputSchema() (*OutputSchema, error) {
	if len(a.OutputSchema) == 0 {
		return nil, nil
	}
	if !json.Valid(a.OutputSchema) {
		return nil, fmt.Errorf("%w: not valid JSON", ErrInvalidJSON)
	}
	sch, err := CompileToolSchema(OutputSchemaURL, a.OutputSchema)
	if err != nil {
		return nil, err
	}
	return &OutputSchema{sch: sch}, nil
}

// OutputSchema is an agent's compiled output schema.
type OutputSchema struct{ sch *jsonschema.Schema }

// Check validates a final answer's text: it must be one JSON value that
// the schema accepts. The value is returned compact; the error is a
// *SchemaError listing every problem, which the model is shown.
func (o *OutputSchema) Check(answer string) (json.RawMessage, error) {
	text := bytes.TrimSpace([]byte(answer))
	v, err := decodeInstance(text)
	if err != nil {
		return nil, &SchemaError{Schema: "output_schema", Problems: []string{"the answer is not one JSON value: " + err.Error()}}
	}
	if err := validateValue("output_schema", o.sch, v); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, text); err != nil {
		return nil, &SchemaError{Schema: "output_schema", Problems: []string{"the answer is not one JSON value: " + err.Error()}}
	}
	return b.Bytes(), nil
}
