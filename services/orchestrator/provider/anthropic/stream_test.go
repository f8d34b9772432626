package anthropic_test

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
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// Streamed replies in the Messages API wire format
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming): each
// event an "event:" line and a "data:" line; message_start (with the input
// usage), per content block content_block_start, content_block_delta
// (text_delta, input_json_delta) and content_block_stop, message_delta
// (stop_reason and the output usage), message_stop; ping anywhere, and an
// error event when the stream fails.

func event(typ, data string) providertest.Event { return providertest.Event{Type: typ, Data: data} }

func messageStart(input, cacheWrites, cacheReads int) providertest.Event {
	return event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_01Aq9w938a90dw8q","type":"message","role":"assistant",`+
		`"model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,`+
		`"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":1,"service_tier":"standard"}}}`,
		input, cacheWrites, cacheReads))
}

func ping() providertest.Event { return event("ping", `{"type": "ping"}`) }

func textStart(index int) providertest.Event {
	return event("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}`, index))
}

func textDelta(index int, text string) providertest.Event {
	q, _ := json.Marshal(text)
	return event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%s}}`, index, q))
}

func toolStart(index int, id, name string) providertest.Event {
	return event("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"tool_use","id":%q,"name":%q,"input":{}}}`, index, id, name))
}

func jsonDelta(index int, partial string) providertest.Event {
	q, _ := json.Marshal(partial)
	return event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"input_json_delta","partial_json":%s}}`, index, q))
}

func blockStop(index int) providertest.Event {
	return event("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, index))
}

func messageDelta(stop string, output int) providertest.Event {
	return event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":%d}}`, stop, output))
}

func messageStop() providertest.Event { return event("message_stop", `{"type":"message_stop"}`) }

func errorEvent(typ, message string) providertest.Event {
	return event("error", fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, typ, message))
}

func words(n int) ([]string, string) {
	var pieces []string
	for i := range n {
		pieces = append(pieces, fmt.Sprintf("w%d ", i))
	}
	return pieces, strings.Join(pieces, "")
}

// The answer of TestAnthropicWireRoundTrip, streamed: a text block, then two
// tool_use blocks whose input_json_delta pieces interleave and split the
// JSON anywhere.
func toolUseEvents() []providertest.Event {
	return []providertest.Event{
		messageStart(472, 0, 0),
		textStart(0),
		ping(),
		textDelta(0, "I'll echo and "),
		textDelta(0, "compute at once."),
		blockStop(0),
		toolStart(1, "toolu_01A09q90qw90lq917835lq9", "echo"),
		jsonDelta(1, ""),
		jsonDelta(1, `{"te`),
		toolStart(2, "toolu_01B19q90qw90lq917835lq8", "calculator"),
		jsonDelta(2, `{"expr`),
		jsonDelta(1, `xt": "h`),
		jsonDelta(2, `ession": 4`),
		jsonDelta(1, `i"}`),
		blockStop(1),
		jsonDelta(2, `2}`),
		blockStop(2),
		messageDelta("tool_use", 91),
		messageStop(),
	}
}

func streamer(baseURL string, retries int) provider.Streamer {
	return anthropic.New(provider.Config{APIKey: "sk-ant-secret", BaseURL: baseURL, MaxRetries: retries})
}

// A text of 20 text_delta events streams event by event: the fake model
// writes the first, then waits for onDelta to have it before it writes the
// rest, so the call cannot have buffered the answer; the input usage is
// message_start's (cache included), the output message_delta's.
func TestAnthropicStreamText(t *testing.T) {
	pieces, text := words(20)
	deltas := providertest.NewDeltas()
	events := []providertest.Event{messageStart(650, 10, 100), textStart(0)}
	for i, p := range pieces {
		ev := textDelta(0, p)
		if i == 1 {
			ev.After = deltas.First()
		}
		events = append(events, ev)
	}
	events = append(events, blockStop(0), messageDelta("end_turn", 20), messageStop())
	f := providertest.New(t, providertest.Reply{Events: events})
	p := anthropic.New(provider.Config{APIKey: "sk-ant-test", BaseURL: f.URL})

	// A safety net, not a timing assertion: a call that buffered the
	// stream would wait for ever.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp, err := p.Stream(ctx, anthropicRequest(providertest.Question()), deltas.On)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{Content: text, StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 760, OutputTokens: 20}}, resp)
	got := deltas.All()
	require.Len(t, got, 20)
	for i, d := range got {
		require.Equal(t, provider.Delta{Text: pieces[i]}, d)
	}
	providertest.RequireSum(t, 1, got, resp)

	req := f.Requests()[0]
	require.Equal(t, "/v1/messages", req.Path)
	require.Equal(t, true, req.Body["stream"])
	require.NotContains(t, req.Body, "tool_choice", "the default choice is the API's")
}

// Text, then two tool_use blocks whose input pieces interleave: the answer
// is Complete's for the same message.
func TestAnthropicStreamToolUse(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Events: toolUseEvents()})
	deltas := providertest.NewDeltas()
	resp, err := streamer(f.URL, 0).Stream(t.Context(), anthropicRequest(providertest.Question()), deltas.On)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{
		Content:    "I'll echo and compute at once.",
		StopReason: "tool_use",
		ToolCalls:  providertest.Calls("toolu_01A09q90qw90lq917835lq9", "toolu_01B19q90qw90lq917835lq8"),
		Usage:      envelope.Usage{InputTokens: 472, OutputTokens: 91},
	}, resp)
	require.Equal(t, []provider.Delta{
		{Text: "I'll echo and "},
		{Text: "compute at once."},
		providertest.CallDelta(0, "toolu_01A09q90qw90lq917835lq9", "echo", ""),
		providertest.CallDelta(0, "", "", `{"te`),
		providertest.CallDelta(1, "toolu_01B19q90qw90lq917835lq8", "calculator", ""),
		providertest.CallDelta(1, "", "", `{"expr`),
		providertest.CallDelta(0, "", "", `xt": "h`),
		providertest.CallDelta(1, "", "", `ession": 4`),
		providertest.CallDelta(0, "", "", `i"}`),
		providertest.CallDelta(1, "", "", `2}`),
	}, deltas.All())
	providertest.RequireSum(t, 1, deltas.All(), resp)
}

// How a stream that breaks is retried as a whole call, and what is not.
func TestAnthropicStreamFailures(t *testing.T) {
	pieces, text := words(3)
	broken := []providertest.Event{messageStart(12, 0, 0), textStart(0), textDelta(0, "an answer that "), textDelta(0, "breaks off")}
	good := providertest.Reply{Events: []providertest.Event{messageStart(12, 0, 0), textStart(0),
		textDelta(0, pieces[0]), ping(), textDelta(0, pieces[1]), textDelta(0, pieces[2]), blockStop(0), messageDelta("end_turn", 3), messageStop()}}
	want := envelope.ModelResponse{Content: text, StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 12, OutputTokens: 3}}
	then := func(evs ...providertest.Event) []providertest.Event {
		return append(broken[:len(broken):len(broken)], evs...)
	}
	providertest.CheckStreams(t, []providertest.StreamCase{
		{Name: "error event mid-stream, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: then(errorEvent("overloaded_error", "Overloaded"))}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "dropped connection, then success", Retries: 2,
			// Dropped after message_delta: message_stop is missing.
			Replies:  []providertest.Reply{{Events: then(blockStop(0), messageDelta("end_turn", 5)), Drop: true}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "malformed event, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: then(event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_del`))}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "delta of a block that never started, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: then(textDelta(3, "?"))}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "end before message_stop, then success", Retries: 2,
			Replies:  []providertest.Reply{{Events: then(blockStop(0), messageDelta("end_turn", 5))}, good},
			Attempts: 2, Discards: 1, Want: want},
		{Name: "error event mid-stream on every attempt", Retries: 2,
			Replies:  []providertest.Reply{{Events: then(errorEvent("overloaded_error", "Overloaded"))}},
			Attempts: 3, Discards: 2,
			Err: []string{"anthropic model claude-sonnet-4-5 failed after 3 attempts", "overloaded_error", "Overloaded"}},
		{Name: "no retries", Retries: -1,
			Replies:  []providertest.Reply{{Events: then(errorEvent("api_error", "Internal server error"))}},
			Attempts: 1, Err: []string{"anthropic model claude-sonnet-4-5 failed:", "Internal server error"}},
		{Name: "529 before the stream: the SDK retries, without a Discard", Retries: 2,
			Replies: []providertest.Reply{
				{Status: 529, Headers: map[string]string{"Retry-After": "0"}, Body: anthropicOverloaded}, good},
			Attempts: 2, Want: want},
		{Name: "400 before the stream is not retried", Retries: 3,
			Replies: []providertest.Reply{{Status: http.StatusBadRequest,
				Body: `{"type":"error","error":{"type":"invalid_request_error","message":"tools.2.input_schema: JSON schema is invalid"}}`}},
			Attempts: 1, Err: []string{"anthropic model claude-sonnet-4-5 failed:", "400", "JSON schema is invalid"}},
		{Name: "tool_use without a name is not retried", Retries: 3,
			Replies: []providertest.Reply{{Events: []providertest.Event{messageStart(1, 0, 0), toolStart(0, "toolu_1", ""),
				blockStop(0), messageDelta("tool_use", 1), messageStop()}}},
			Attempts: 1, Err: []string{"malformed response: tool_use block 0 has no name"}},
	}, streamer, anthropicRequest([]envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}))
}

// A stream the caller cancels is not retried.
func TestAnthropicStreamCanceled(t *testing.T) {
	deltas := providertest.NewDeltas()
	hold := make(chan struct{}) // never closed: the stream stops after its first text
	events := []providertest.Event{messageStart(1, 0, 0), textStart(0), textDelta(0, "one"), textDelta(0, "two"), blockStop(0),
		messageDelta("end_turn", 2), messageStop()}
	events[3].After = hold
	f := providertest.New(t, providertest.Reply{Events: events})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := streamer(f.URL, 3).Stream(ctx, anthropicRequest(providertest.Question()), func(d provider.Delta) {
		deltas.On(d)
		cancel()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, f.Requests(), 1)
	require.Equal(t, []provider.Delta{{Text: "one"}}, deltas.All(), "no Discard: nothing starts over")
}
