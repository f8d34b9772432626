package anthropic_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// The tool controls and the output schema reach the request body the same
// way from Complete and from Stream.
func TestAnthropicToolControls(t *testing.T) {
	no, yes := false, true
	object := `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}`
	array := `{"type":"array","items":{"$ref":"#/$defs/n"},"$defs":{"n":{"type":"integer"}}}`
	objectTool := `{"name":"final_output","description":"Gives the final answer: its input is the answer.",
	  "input_schema":{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}}`
	arrayTool := `{"name":"final_output","description":"Gives the final answer: its \"value\" is the answer.",
	  "input_schema":{"type":"object","properties":{"value":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["value"],
	    "$defs":{"n":{"type":"integer"}}}}`
	const objectSentence = "Give your final answer by calling the final_output tool: its input is the answer."
	const arraySentence = "Give your final answer by calling the final_output tool: its \"value\" is the answer."
	for _, tc := range []struct {
		name     string
		choice   string
		parallel *bool
		schema   string
		noTools  bool
		choiceIs string // the body's tool_choice; "" for none
		output   string // the final_output tool, offered last; "" for none
		system   string // the system prompt
	}{
		{name: "default"},
		{name: "auto", choice: "auto", choiceIs: `{"type":"auto"}`},
		{name: "required", choice: "required", choiceIs: `{"type":"any"}`},
		{name: "none keeps the tools", choice: "none", choiceIs: `{"type":"none"}`},
		{name: "a tool's name", choice: "calculator", choiceIs: `{"type":"tool","name":"calculator"}`},
		{name: "parallel off", parallel: &no, choiceIs: `{"type":"auto","disable_parallel_tool_use":true}`},
		{name: "parallel off, auto", choice: "auto", parallel: &no, choiceIs: `{"type":"auto","disable_parallel_tool_use":true}`},
		{name: "parallel off, required", choice: "required", parallel: &no, choiceIs: `{"type":"any","disable_parallel_tool_use":true}`},
		{name: "parallel off, a tool's name", choice: "echo", parallel: &no, choiceIs: `{"type":"tool","name":"echo","disable_parallel_tool_use":true}`},
		{name: "parallel off, none", choice: "none", parallel: &no, choiceIs: `{"type":"none"}`},
		{name: "parallel on", parallel: &yes},
		{name: "object output schema", schema: object, output: objectTool, system: "Be brief.\n\n" + objectSentence},
		{name: "array output schema, wrapped, forced without tools", schema: array, noTools: true,
			choiceIs: `{"type":"tool","name":"final_output"}`, output: arrayTool, system: "Be brief.\n\n" + arraySentence},
		{name: "output schema with none: the output tool is forced", schema: object, choice: "none",
			choiceIs: `{"type":"tool","name":"final_output"}`, output: objectTool, system: "Be brief.\n\n" + objectSentence},
		{name: "output schema with required: no output tool in this call", schema: object, choice: "required", choiceIs: `{"type":"any"}`},
	} {
		req := anthropicRequest(providertest.Question())
		req.ToolChoice, req.ParallelToolCalls, req.OutputSchema = tc.choice, tc.parallel, json.RawMessage(tc.schema)
		if tc.noTools {
			req.Tools = nil
		}
		if tc.system == "" {
			tc.system = "Be brief."
		}
		for _, mode := range []string{"Complete", "Stream"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				reply := providertest.Reply{Body: anthropicFinal}
				if mode == "Stream" {
					reply = providertest.Reply{Events: []providertest.Event{messageStart(1, 0, 0), textStart(0), textDelta(0, "ok"),
						blockStop(0), messageDelta("end_turn", 1), messageStop()}}
				}
				f := providertest.New(t, reply)
				p := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL})
				require.NoError(t, providertest.Ask(t.Context(), p, mode, req))
				body := f.Requests()[0].Body
				if tc.choiceIs == "" {
					require.NotContains(t, body, "tool_choice")
				} else {
					require.Equal(t, providertest.JSON(t, tc.choiceIs), body["tool_choice"])
				}
				tools, _ := body["tools"].([]any)
				var names []string
				for _, tool := range tools {
					names = append(names, tool.(map[string]any)["name"].(string))
				}
				want := []string{"echo", "calculator"}
				if tc.noTools {
					want = nil
				}
				if tc.output != "" {
					want = append(want, provider.OutputToolName)
					require.Equal(t, providertest.JSON(t, tc.output), tools[len(tools)-1])
				}
				require.Equal(t, want, names, "the tools are offered, whatever the choice")
				require.Equal(t, providertest.JSON(t, fmt.Sprintf(`[{"type":"text","text":%q}]`, tc.system)), body["system"])
			})
		}
	}
}

// block is a content block of a canned answer, for its Complete and its
// Stream form alike.
type block struct {
	text     string // a text block's text
	id, name string // a tool_use block's
	input    string // its input, JSON
}

// message is the answer of blocks as a Messages API message.
func message(blocks []block) string {
	var content []string
	for _, b := range blocks {
		if b.name == "" {
			q, _ := json.Marshal(b.text)
			content = append(content, `{"type":"text","text":`+string(q)+`}`)
		} else {
			content = append(content, fmt.Sprintf(`{"type":"tool_use","id":%q,"name":%q,"input":%s}`, b.id, b.name, b.input))
		}
	}
	return `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[` + strings.Join(content, ",") +
		`],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":20}}`
}

// events are the answer of blocks streamed, texts and inputs in pieces of
// at most 5 bytes.
func events(blocks []block) []providertest.Event {
	out := []providertest.Event{messageStart(30, 0, 0)}
	for i, b := range blocks {
		s := b.input
		if b.name == "" {
			s = b.text
			out = append(out, textStart(i))
		} else {
			out = append(out, toolStart(i, b.id, b.name))
		}
		for len(s) > 0 {
			n := min(5, len(s))
			if b.name == "" {
				out = append(out, textDelta(i, s[:n]))
			} else {
				out = append(out, jsonDelta(i, s[:n]))
			}
			s = s[n:]
		}
		out = append(out, blockStop(i))
	}
	return append(out, messageDelta("tool_use", 20), messageStop())
}

// The output tool's call is the answer, and only when it is: its input,
// compact, unwrapped when the schema was; with other tools it is dropped.
// Streamed, its input's pieces are Text deltas, and when the answer turns
// out to be other than what was streamed, a Discard voids that.
func TestAnthropicOutputAnswer(t *testing.T) {
	object := `{"type":"object","properties":{"answer":{"type":"string"},"n":{"type":"integer"}}}`
	array := `{"type":"array","items":{"type":"integer"}}`
	answer := block{id: "toolu_out", name: provider.OutputToolName, input: `{ "answer" : "4 2", "n": 42 }`}
	echo := block{id: "toolu_echo", name: "echo", input: `{"text": "hi"}`}
	usage := envelope.Usage{InputTokens: 30, OutputTokens: 20}
	echoCall := envelope.ToolCall{ID: "toolu_echo", Name: "echo", Arguments: json.RawMessage(`{"text": "hi"}`)}
	for _, tc := range []struct {
		name     string
		schema   string
		blocks   []block
		want     envelope.ModelResponse
		discards int // of Stream
	}{
		{name: "the output call is the answer", schema: object, blocks: []block{answer},
			want: envelope.ModelResponse{Content: `{"answer":"4 2","n":42}`}},
		{name: "a wrapped schema's answer is unwrapped", schema: array,
			blocks: []block{{id: "toolu_out", name: provider.OutputToolName, input: `{"value": [1, 2,
			 3]}`}},
			want: envelope.ModelResponse{Content: `[1,2,3]`}},
		{name: "text before the answer is void", schema: object, blocks: []block{{text: "Here it is."}, answer},
			want: envelope.ModelResponse{Content: `{"answer":"4 2","n":42}`}, discards: 1},
		{name: "with a tool call after, the output call is dropped", schema: object, blocks: []block{answer, echo},
			want: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{echoCall}}, discards: 1},
		{name: "with a tool call before, the output call is dropped", schema: object, blocks: []block{{text: "First:"}, echo, answer},
			want: envelope.ModelResponse{Content: "First:", ToolCalls: []envelope.ToolCall{echoCall}}},
		{name: "a second output call is not the answer", schema: object,
			blocks: []block{answer, {id: "toolu_out2", name: provider.OutputToolName, input: `{"answer":"no"}`}},
			want:   envelope.ModelResponse{Content: `{"answer":"4 2","n":42}`}},
		{name: "without an output schema, final_output is a tool like others", blocks: []block{answer},
			want: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "toolu_out", Name: provider.OutputToolName,
				Arguments: json.RawMessage(answer.input)}}}},
	} {
		tc.want.StopReason, tc.want.Usage = "tool_use", usage
		req := anthropicRequest(providertest.Question())
		req.OutputSchema = json.RawMessage(tc.schema)
		t.Run(tc.name+"/Complete", func(t *testing.T) {
			f := providertest.New(t, providertest.Reply{Body: message(tc.blocks)})
			resp, err := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL}).Complete(t.Context(), req)
			require.NoError(t, err)
			require.Equal(t, tc.want, resp)
		})
		t.Run(tc.name+"/Stream", func(t *testing.T) {
			f := providertest.New(t, providertest.Reply{Events: events(tc.blocks)})
			deltas := providertest.NewDeltas()
			resp, err := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL}).Stream(t.Context(), req, deltas.On)
			require.NoError(t, err)
			require.Equal(t, tc.want, resp)
			require.Equal(t, tc.discards, deltas.Discards())
			providertest.RequireSum(t, req.Iteration, deltas.All(), resp)
		})
	}
}

// The output tool's input streams as the answer's text as it comes: the
// pieces compact, the wrapper's key left out.
func TestAnthropicOutputStreamPieces(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Events: []providertest.Event{
		messageStart(5, 0, 0),
		toolStart(0, "toolu_out", provider.OutputToolName),
		jsonDelta(0, `{"val`),
		jsonDelta(0, `ue": ["a `),
		jsonDelta(0, `b", `),
		jsonDelta(0, `"c"] }`),
		blockStop(0),
		messageDelta("tool_use", 9),
		messageStop(),
	}})
	req := anthropicRequest(providertest.Question())
	req.Tools = nil
	req.OutputSchema = json.RawMessage(`{"type":"array","items":{"type":"string"}}`)
	deltas := providertest.NewDeltas()
	resp, err := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL}).Stream(t.Context(), req, deltas.On)
	require.NoError(t, err)
	require.Equal(t, []provider.Delta{{Text: `["a `}, {Text: `b",`}, {Text: `"c"]`}}, deltas.All())
	require.Equal(t, envelope.ModelResponse{Content: `["a b","c"]`, StopReason: "tool_use", Usage: envelope.Usage{InputTokens: 5, OutputTokens: 9}}, resp)
}

func TestAnthropicToolChoiceUnknown(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: anthropicFinal})
	p := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL})
	for _, tc := range []struct {
		choice  string
		noTools bool
		schema  string
		err     string
	}{
		{choice: "web_search", err: `tool_choice "web_search" is not auto, required, none or the name of an offered tool`},
		{choice: "required", noTools: true, err: `tool_choice "required" needs a tool`},
		{choice: "auto", schema: `{"type":`, err: "output schema"},
	} {
		req := anthropicRequest(providertest.Question())
		req.ToolChoice, req.OutputSchema = tc.choice, json.RawMessage(tc.schema)
		if tc.noTools {
			req.Tools = nil
		}
		_, err := p.Complete(t.Context(), req)
		require.ErrorContains(t, err, tc.err)
		_, err = p.Stream(t.Context(), req, nil)
		require.ErrorContains(t, err, tc.err)
	}
	require.Empty(t, f.Requests(), "a request the API would refuse is not sent")
}
