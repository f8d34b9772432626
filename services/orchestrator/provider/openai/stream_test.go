package openai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// Streamed replies in the Chat Completions wire format
// (https://platform.openai.com/docs/api-reference/chat-streaming): each
// chunk a "data:" line, the deltas of choice 0, finish_reason on the last
// chunk of the choice, then (stream_options include_usage) a chunk with no
// choices and the usage, then "data: [DONE]".

// chunk is a chunk whose choice 0 has delta.
func chunk(delta string) string {
	return `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,` +
		`"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306",` +
		`"choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x4"}`
}

// roleChunk is a stream's first chunk: the role, and no content yet.
func roleChunk() string { return chunk(`{"role":"assistant","content":"","refusal":null}`) }

// textChunk is a chunk of text.
func textChunk(text string) string {
	q, _ := json.Marshal(text)
	return chunk(`{"content":` + string(q) + `}`)
}

// callStart is the first chunk of tool call index: its id and name.
func callStart(index int, id, name string) string {
	return chunk(fmt.Sprintf(`{"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":""}}]}`, index, id, name))
}

// argsChunk is a piece of tool call index's arguments.
func argsChunk(index int, args string) string {
	q, _ := json.Marshal(args)
	return chunk(fmt.Sprintf(`{"tool_calls":[{"index":%d,"function":{"arguments":%s}}]}`, index, q))
}

// finishChunk is choice 0's last chunk.
func finishChunk(reason string) string {
	return `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,` +
		`"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_06737a9306",` +
		`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"` + reason + `"}],"usage":null}`
}

// usageChunk is the last chunk of include_usage.
func usageChunk(in, out int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,`+
		`"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_06737a9306","choices":[],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,`+
		`"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`,
		in, out, in+out)
}

// sse is a whole stream of chunks, [DONE] at its end.
func sse(chunks ...string) []providertest.Event {
	return providertest.Data(append(chunks, "[DONE]")...)
}

// words are n pieces of text and what they add up to.
func words(n int) ([]string, string) {
	var pieces []string
	for i := range n {
		pieces = append(pieces, fmt.Sprintf("w%d ", i))
	}
	return pieces, strings.Join(pieces, "")
}

// The two parallel calls of the Question, their argument pieces
// interleaved and split anywhere, in the middle of a key or a string.
func parallelCalls() []string {
	return []string{
		roleChunk(),
		callStart(0, "call_echo_1", "echo"),
		argsChunk(0, `{"te`),
		callStart(1, "call_calc_2", "calculator"),
		argsChunk(1, `{"expr`),
		argsChunk(0, `xt": "h`),
		argsChunk(1, `ession": 4`),
		argsChunk(0, `i"}`),
		argsChunk(1, `2}`),
		finishChunk("tool_calls"),
		usageChunk(82, 17),
	}
}

func streamer(baseURL string, retries int) provider.Streamer {
	return openai.New(provider.Config{APIKey: "sk-openai-secret", BaseURL: baseURL, MaxRetries: retries})
}

// A text of 20 chunks streams chunk by chunk: the fake model writes the
// first, then waits for onDelta to have it before it writes the rest, so
// the call cannot have buffered the answer; the answer is the deltas'
// sum, the usage that of the last chunk.
func TestOpenAIStreamText(t *testing.T) {
	pieces, text := words(20)
	deltas := providertest.NewDeltas()
	chunks := []string{roleChunk()}
	for _, p := range pieces {
		chunks = append(chunks, textChunk(p))
	}
	events := sse(append(chunks, finishChunk("stop"), usageChunk(140, 20))...)
	events[2].After = deltas.First() // the second piece of text waits for the first to arrive
	f := providertest.New(t, providertest.Reply{Events: events})
	p := openai.New(provider.Config{APIKey: "sk-test", BaseURL: f.URL + "/v1"})

	// A safety net, not a timing assertion: a call that buffered the
	// stream would wait for ever.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp, err := p.Stream(ctx, openAIRequest(providertest.Question()), deltas.On)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{Content: text, StopReason: "stop", Usage: envelope.Usage{InputTokens: 140, OutputTokens: 20}}, resp)
	got := deltas.All()
	require.Len(t, got, 20, "a delta per piece of text, none for the role or the end")
	for i, d := range got {
		require.Equal(t, provider.Delta{Text: pieces[i]}, d)
	}
	providertest.RequireSum(t, 1, got, resp)

	req := f.Requests()[0]
	require.Equal(t, "/v1/chat/completions", req.Path)
	require.Equal(t, true, req.Body["stream"])
	require.Equal(t, map[string]any{"include_usage": true}, req.Body["stream_options"])
	require.Equal(t, true, req.Body["parallel_tool_calls"])
}

// Two parallel tool calls, their arguments interleaved and split in the
// middle of the JSON: a delta per piece, the id and name on the first; the
// answer is Complete's for the same calls.
func TestOpenAIStreamParallelToolCalls(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Events: sse(parallelCalls()...)})
	deltas := providertest.NewDeltas()
	resp, err := streamer(f.URL, 0).Stream(t.Context(), openAIRequest(providertest.Question()), deltas.On)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{
		StopReason: "tool_calls",
		ToolCalls:  providertest.Calls("call_echo_1", "call_calc_2"),
		Usage:      envelope.Usage{InputTokens: 82, OutputTokens: 17},
	}, resp)
	call := providertest.CallDelta
	require.Equal(t, []provider.Delta{
		call(0, "call_echo_1", "echo", ""),
		call(0, "", "", `{"te`),
		call(1, "call_calc_2", "calculator", ""),
		call(1, "", "", `{"expr`),
		call(0, "", "", `xt": "h`),
		call(1, "", "", `ession": 4`),
		call(0, "", "", `i"}`),
		call(1, "", "", `2}`),
	}, deltas.All())
	providertest.RequireSum(t, 1, deltas.All(), resp)
}

// How a stream that breaks is retried as a whole call, and what is not.
func TestOpenAIStreamFailures(t *testing.T) {
	pieces, text := words(3)
	first := sse(roleChunk(), textChunk("an answer that "), textChunk("breaks off"))
	errorChunk := `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`
	good := providertest.Reply{Events: sse(roleChunk(), textChunk(pieces[0]), textChunk(pieces[1]), textChunk(pieces[2]), finishChunk("stop"), usageChunk(9, 3))}
	want := envelope.ModelResponse{Content: text, StopReason: "stop", Usage: envelope.Usage{InputTokens: 9, OutputTokens: 3}}
	withError := func(evs []providertest.Event) []providertest.Event {
		return append(evs[:len(evs)-1:len(evs)-1], providertest.Event{Data: errorChunk})
	}
	providertest.CheckStreams(t, []providertest.StreamCase{
		{Name: "error chunk mid-stream, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: withError(first)}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "dropped connection, then success", Retries: 2,
			// Dropped after the finish_reason: the stream's end is missing
			// all the same.
			Replies:  []providertest.Reply{{Events: providertest.Data(roleChunk(), textChunk("an answer"), finishChunk("stop")), Drop: true}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "malformed chunk, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: append(first[:2:2], providertest.Event{Data: `{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"tru`})}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "end without finish_reason, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: first}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "error chunk mid-stream on every attempt", Retries: 2,
			Replies:  []providertest.Reply{{Events: withError(first)}},
			Attempts: 3, Discards: 2,
			Err: []string{"openai model gpt-4o-mini failed after 3 attempts", "received error while streaming", "The server had an error"}},
		{Name: "no retries", Retries: -1,
			Replies:  []providertest.Reply{{Events: withError(first)}},
			Attempts: 1, Discards: 0, Err: []string{"openai model gpt-4o-mini failed:", "The server had an error"}},
		{Name: "5xx before the stream: the SDK retries, without a Discard", Retries: 2,
			Replies: []providertest.Reply{
				{Status: http.StatusInternalServerError, Headers: map[string]string{"Retry-After": "0"}, Body: openAIServerError}, good},
			Attempts: 2, Discards: 0, Want: want},
		{Name: "400 before the stream is not retried", Retries: 3,
			Replies: []providertest.Reply{{Status: http.StatusBadRequest,
				Body: `{"error":{"message":"Invalid schema for response_format 'final_output'","type":"invalid_request_error","param":"response_format","code":null}}`}},
			Attempts: 1, Err: []string{"openai model gpt-4o-mini failed:", "400 Bad Request", "Invalid schema for response_format"}},
		{Name: "tool call without a name is not retried", Retries: 3,
			Replies:  []providertest.Reply{{Events: sse(roleChunk(), argsChunk(0, `{}`), finishChunk("tool_calls"))}},
			Attempts: 1, Err: []string{"malformed response: tool call 0 has no function name"}},
	}, streamer, openAIRequest([]envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}))
}

// A stream the caller cancels is not retried.
func TestOpenAIStreamCanceled(t *testing.T) {
	deltas := providertest.NewDeltas()
	hold := make(chan struct{}) // never closed: the stream stops after its first text
	events := sse(roleChunk(), textChunk("one"), textChunk("two"), finishChunk("stop"))
	events[2].After = hold
	f := providertest.New(t, providertest.Reply{Events: events})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := streamer(f.URL, 3).Stream(ctx, openAIRequest(providertest.Question()), func(d provider.Delta) {
		deltas.On(d)
		cancel()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, f.Requests(), 1)
	require.Equal(t, []provider.Delta{{Text: "one"}}, deltas.All(), "no Discard: nothing starts over")
}

// A stream in the format of a server that ignores include_usage (no usage
// chunk) still answers, without usage.
func TestOpenAIStreamWithoutUsage(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Events: sse(roleChunk(), textChunk("hi"), finishChunk("stop"))})
	resp, err := streamer(f.URL, 0).Stream(t.Context(), openAIRequest(providertest.Question()), nil)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{Content: "hi", StopReason: "stop"}, resp)
}

// The tool controls and the output schema reach the request body the same
// way from Complete and from Stream.
func TestOpenAIToolControls(t *testing.T) {
	no, yes := false, true
	schema := `{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}`
	format := `{"type":"json_schema","json_schema":{"name":"final_output","schema":` + schema + `,"strict":false}}`
	for _, tc := range []struct {
		name     string
		choice   string
		parallel *bool
		schema   string
		noTools  bool
		want     string // the body's tool_choice, parallel_tool_calls and response_format
	}{
		{name: "default", want: `{"parallel_tool_calls": true}`},
		{name: "auto", choice: "auto", want: `{"tool_choice": "auto", "parallel_tool_calls": true}`},
		{name: "required", choice: "required", want: `{"tool_choice": "required", "parallel_tool_calls": true}`},
		{name: "none keeps the tools, sends no parallel_tool_calls", choice: "none", parallel: &no, want: `{"tool_choice": "none"}`},
		{name: "a tool's name", choice: "calculator",
			want: `{"tool_choice": {"type": "function", "function": {"name": "calculator"}}, "parallel_tool_calls": true}`},
		{name: "parallel off", parallel: &no, want: `{"parallel_tool_calls": false}`},
		{name: "parallel on", choice: "auto", parallel: &yes, want: `{"tool_choice": "auto", "parallel_tool_calls": true}`},
		{name: "output schema", schema: schema, want: `{"parallel_tool_calls": true, "response_format": ` + format + `}`},
		{name: "output schema without tools", schema: schema, noTools: true, parallel: &no, want: `{"response_format": ` + format + `}`},
	} {
		req := openAIRequest(providertest.Question())
		req.ToolChoice, req.ParallelToolCalls, req.OutputSchema = tc.choice, tc.parallel, json.RawMessage(tc.schema)
		if tc.noTools {
			req.Tools = nil
		}
		for _, mode := range []string{"Complete", "Stream"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				reply := providertest.Reply{Body: openAIFinal}
				if mode == "Stream" {
					reply = providertest.Reply{Events: sse(textChunk("ok"), finishChunk("stop"))}
				}
				f := providertest.New(t, reply)
				p := openai.New(provider.Config{APIKey: "k", BaseURL: f.URL})
				require.NoError(t, providertest.Ask(t.Context(), p, mode, req))
				body := f.Requests()[0].Body
				picked := map[string]any{}
				for _, k := range []string{"tool_choice", "parallel_tool_calls", "response_format"} {
					if v, ok := body[k]; ok {
						picked[k] = v
					}
				}
				require.Equal(t, providertest.JSON(t, tc.want), picked)
				_, hasTools := body["tools"]
				require.Equal(t, !tc.noTools, hasTools, "the tools are offered, whatever the choice")
				if mode == "Stream" {
					require.Equal(t, true, body["stream"])
				}
			})
		}
	}
}

func TestOpenAIToolChoiceUnknown(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: openAIFinal})
	p := openai.New(provider.Config{APIKey: "k", BaseURL: f.URL})
	for _, tc := range []struct {
		choice  string
		noTools bool
		err     string
	}{
		{choice: "web_search", err: `tool_choice "web_search" is not auto, required, none or the name of an offered tool`},
		{choice: "required", noTools: true, err: `tool_choice "required" needs a tool`},
	} {
		req := openAIRequest(providertest.Question())
		req.ToolChoice = tc.choice
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
