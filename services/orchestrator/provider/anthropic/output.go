package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// The tool controls, and the tool-forced output: the Messages API's way to
// an answer that satisfies a schema is a tool whose input schema is that
// schema, offered for the final answer. The tool is provider.OutputToolName;
// the model's call of it is the answer, its input the answer's value
// (compact JSON text), and never a tool call of the turn.

// output is how a request offers its output schema.
type output struct {
	// offered: the tool provider.OutputToolName is offered. It is when the
	// request has an output schema and its tool choice lets the model
	// answer (auto or none): a required or named tool leaves no answer to
	// give in this call.
	offered bool
	// wrapped: the schema is not an object schema, which a tool's input must
	// be, so the tool's input is {"value": <the answer>}.
	wrapped bool
	// forced: tool_choice forces the tool, as the request offers no other
	// (or, with tool choice none, lets the model call no other).
	forced bool
}

// outputValue is the member of a wrapped output tool's input that holds the
// answer.
const outputValue = "value"

// offerOutput offers the tool of the request's output schema, if any, and
// tells the model in the system prompt to answer by calling it.
func offerOutput(p *anthropic.MessageNewParams, req provider.Request) (output, error) {
	if len(bytes.TrimSpace(req.OutputSchema)) == 0 {
		return output{}, nil
	}
	switch req.ToolChoice {
	case "", envelope.ToolChoiceAuto, envelope.ToolChoiceNone:
	default:
		return output{}, nil
	}
	var schema any
	if err := json.Unmarshal(req.OutputSchema, &schema); err != nil {
		return output{}, fmt.Errorf("anthropic: output schema: %w", err)
	}
	out := output{offered: true, forced: len(req.Tools) == 0 || req.ToolChoice == envelope.ToolChoiceNone}
	obj, _ := schema.(map[string]any)
	if obj != nil {
		// Identification, not constraints, as of a tool's input schema.
		delete(obj, "$schema")
		delete(obj, "$id")
	}
	var in anthropic.ToolInputSchemaParam
	description := "Gives the final answer: its input is the answer."
	sentence := fmt.Sprintf("Give your final answer by calling the %s tool: its input is the answer.", provider.OutputToolName)
	if obj != nil && obj["type"] == "object" {
		in = inputSchema(obj)
	} else {
		out.wrapped = true
		wrapper := map[string]any{}
		if obj != nil {
			// The schema's definitions move to the root, where its
			// references ("#/$defs/...") look for them.
			for _, k := range []string{"$defs", "definitions"} {
				if d, ok := obj[k]; ok {
					wrapper[k] = d
					delete(obj, k)
				}
			}
		}
		in = anthropic.ToolInputSchemaParam{Properties: map[string]any{outputValue: schema}, Required: []string{outputValue}, ExtraFields: wrapper}
		description = fmt.Sprintf("Gives the final answer: its %q is the answer.", outputValue)
		sentence = fmt.Sprintf("Give your final answer by calling the %s tool: its %q is the answer.", provider.OutputToolName, outputValue)
	}
	tool := anthropic.ToolParam{Name: provider.OutputToolName, Description: anthropic.String(description), InputSchema: in}
	p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	if len(p.System) == 0 {
		p.System = []anthropic.TextBlockParam{{Text: sentence}}
	} else {
		p.System[0].Text += "\n\n" + sentence
	}
	return out, nil
}

// toolChoice sets tool_choice from the request's ToolChoice and
// ParallelToolCalls, when there are tools to offer (the API takes none
// without them): auto, required as any, none, a tool's name as tool; and
// disable_parallel_tool_use when parallel calls are forbidden (with auto
// for the default choice). A forced output tool is the choice.
func toolChoice(p *anthropic.MessageNewParams, req provider.Request, out output) error {
	c := req.ToolChoice
	if len(p.Tools) == 0 {
		switch c {
		case "", envelope.ToolChoiceAuto, envelope.ToolChoiceNone:
			return nil
		}
		return fmt.Errorf("anthropic: tool_choice %q needs a tool, and the request offers none", c)
	}
	if out.forced {
		p.ToolChoice = anthropic.ToolChoiceUnionParam{OfTool: &anthropic.ToolChoiceToolParam{Name: provider.OutputToolName}}
		return nil
	}
	var disable param.Opt[bool]
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
		disable = anthropic.Bool(true)
	}
	switch c {
	case "":
		if disable.Valid() {
			p.ToolChoice = anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{DisableParallelToolUse: disable}}
		}
	case envelope.ToolChoiceAuto:
		p.ToolChoice = anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{DisableParallelToolUse: disable}}
	case envelope.ToolChoiceRequired:
		p.ToolChoice = anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{DisableParallelToolUse: disable}}
	case envelope.ToolChoiceNone:
		p.ToolChoice = anthropic.ToolChoiceUnionParam{OfNone: &anthropic.ToolChoiceNoneParam{}}
	default:
		if !slices.ContainsFunc(req.Tools, func(d envelope.ToolDefinition) bool { return d.Name == c }) {
			return fmt.Errorf("anthropic: tool_choice %q is not auto, required, none or the name of an offered tool", c)
		}
		p.ToolChoice = anthropic.ToolChoiceUnionParam{OfTool: &anthropic.ToolChoiceToolParam{Name: c, DisableParallelToolUse: disable}}
	}
	return nil
}

// outputText decodes the output tool's input, piece by piece as it
// streams, into the answer's text: the input as compact JSON (its
// whitespace outside strings left out), or, when the schema was wrapped,
// only the value of the input's "value" member. An input that is not an
// object then has no such value, and gives no text. It never fails: what
// is not JSON passes (compacted) for the orchestrator's validation to
// reject.
type outputText struct {
	unwrap bool

	inString bool // in a string
	escape   bool // after a backslash in a string
	// unwrap's state: how deep in the input, what comes next at depth 1,
	// the member's key so far, and whether the bytes are the answer.
	depth    int
	phase    phase
	inKey    bool
	key      []byte
	emitting bool
	done     bool // after the input's value (or on one that is no object)
}

// phase is what comes next in the input object (depth 1).
type phase int

const (
	phaseKey   phase = iota // a member's key, or the object's end
	phaseColon              // the colon after the key
	phaseValue              // the member's value, until a comma or the end
)

// write decodes the next piece of the input: the piece of the answer's
// text it holds.
func (o *outputText) write(piece string) string {
	var b strings.Builder
	for i := 0; i < len(piece); i++ {
		if o.unwrap {
			o.unwrapByte(&b, piece[i])
		} else {
			o.compactByte(&b, piece[i])
		}
	}
	return b.String()
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// inStringByte follows a byte of a string; it says whether the string
// ended.
func (o *outputText) inStringByte(c byte) bool {
	switch {
	case o.escape:
		o.escape = false
	case c == '\\':
		o.escape = true
	case c == '"':
		o.inString = false
		return true
	}
	return false
}

func (o *outputText) compactByte(b *strings.Builder, c byte) {
	switch {
	case o.inString:
		o.inStringByte(c)
	case isSpace(c):
		return
	case c == '"':
		o.inString = true
	}
	b.WriteByte(c)
}

func (o *outputText) unwrapByte(b *strings.Builder, c byte) {
	if o.inString {
		if o.inKey {
			o.key = append(o.key, c)
		} else if o.emitting {
			b.WriteByte(c)
		}
		if o.inStringByte(c) && o.inKey {
			o.inKey = false
			o.phase = phaseColon
		}
		return
	}
	if isSpace(c) || o.done {
		return
	}
	if o.depth == 0 {
		if c != '{' {
			o.done = true // not an object: no value member
			return
		}
		o.depth, o.phase = 1, phaseKey
		return
	}
	if o.depth == 1 {
		switch o.phase {
		case phaseKey:
			switch c {
			case '"':
				o.inString, o.inKey = true, true
				o.key = append(o.key[:0], c)
			case '}':
				o.depth, o.done = 0, true
			}
			return
		case phaseColon:
			if c == ':' {
				var k string
				o.phase = phaseValue
				o.emitting = json.Unmarshal(o.key, &k) == nil && k == outputValue
			}
			return
		case phaseValue:
			switch c {
			case ',':
				o.phase, o.emitting = phaseKey, false
				return
			case '}':
				o.depth, o.done, o.emitting = 0, true, false
				return
			}
		}
	}
	switch c {
	case '{', '[':
		o.depth++
	case '}', ']':
		if o.depth > 1 {
			o.depth--
		}
	case '"':
		o.inString = true
	}
	if o.emitting {
		b.WriteByte(c)
	}
}
