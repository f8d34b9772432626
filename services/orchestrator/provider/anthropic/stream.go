package anthropic

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Stream implements provider.Streamer: the request of Complete with
// "stream": true, its events passed to onDelta as they arrive: a text
// block's text_delta pieces as Text, a tool_use block's id and name
// (content_block_start) and input_json_delta pieces as a ToolCall
// (numbered from 0 in the order of the tool_use blocks), and the output
// tool's input_json_delta pieces as the Text of the answer (output.go).
// Usage is message_start's input and message_delta's output. A stream that
// breaks after it started (an error event, a dropped connection, an event
// that does not decode, an end before message_stop) is requested again
// after a Discard, as often as the configuration's MaxRetries says;
// failures before it starts are the SDK's to retry, as in Complete.
func (p *Provider) Stream(ctx context.Context, req provider.Request, onDelta func(provider.Delta)) (envelope.ModelResponse, error) {
	params, out, err := messageParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	if onDelta == nil {
		onDelta = func(provider.Delta) {}
	}
	var attempts atomic.Int32
	opts := requestOptions(req, &attempts)
	resp, err := provider.RetryStream(ctx, p.retries, onDelta, func() (envelope.ModelResponse, error) {
		return p.streamOnce(ctx, req, params, out, onDelta, opts)
	})
	if err != nil {
		return envelope.ModelResponse{}, provider.Failure(Name, req.Model.Name, int(attempts.Load()), err)
	}
	return resp, nil
}

// streamOnce makes one streamed request. Its failures after the stream
// started are provider.Broken.
func (p *Provider) streamOnce(ctx context.Context, req provider.Request, params anthropic.MessageNewParams, out output,
	onDelta func(provider.Delta), opts []option.RequestOption) (envelope.ModelResponse, error) {
	stream := p.client.Messages.NewStreaming(ctx, params, opts...)
	defer func() { _ = stream.Close() }()
	if err := stream.Err(); err != nil {
		// The request failed before its stream started; the SDK retried it.
		return envelope.ModelResponse{}, err
	}
	var (
		t                                        = newTurn(req, out, onDelta)
		input, cacheWrites, cacheReads, outputTk int64
		stop                                     string
		stopped                                  bool
	)
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "message_start":
			u := ev.Message.Usage
			input, cacheWrites, cacheReads, outputTk = u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, u.OutputTokens
		case "content_block_start":
			b := ev.ContentBlock
			if err := t.start(ev.Index, b.Type, b.Text, b.ID, b.Name, startInput(b.JSON.Input.Raw())); err != nil {
				return envelope.ModelResponse{}, err
			}
		case "content_block_delta":
			if err := t.delta(ev.Index, ev.Delta.Type, ev.Delta.Text, ev.Delta.PartialJSON); err != nil {
				return envelope.ModelResponse{}, provider.Broken(err)
			}
		case "message_delta":
			// Its usage counts are the message's so far, not increments; the
			// input ones only where it has them.
			stop = string(ev.Delta.StopReason)
			u := ev.Usage
			outputTk = u.OutputTokens
			if u.JSON.InputTokens.Valid() {
				input = u.InputTokens
			}
			if u.JSON.CacheCreationInputTokens.Valid() {
				cacheWrites = u.CacheCreationInputTokens
			}
			if u.JSON.CacheReadInputTokens.Valid() {
				cacheReads = u.CacheReadInputTokens
			}
		case "message_stop":
			stopped = true
		}
	}
	if err := stream.Err(); err != nil {
		return envelope.ModelResponse{}, provider.Broken(err)
	}
	if !stopped {
		return envelope.ModelResponse{}, provider.Broken(errors.New("the stream ended before message_stop"))
	}
	if t.empty() && stop == "" {
		return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: no content and no stop_reason", req.Model.Name)
	}
	resp := t.response()
	resp.StopReason = stop
	resp.Usage = usage(input, cacheWrites, cacheReads, outputTk)
	return resp, nil
}

// startInput is the input a streamed tool_use block starts with: none when
// it is the empty object that input_json_delta pieces then replace.
func startInput(raw string) string {
	switch strings.TrimSpace(raw) {
	case "", "{}", "null":
		return ""
	}
	return raw
}

// turn assembles an answer from its content blocks as they come, all at
// once (Complete) or piece by piece (Stream), into the deltas of
// provider.Streamer, which it passes to emit as they are known. What the
// answer is depends on what came so far: text; or, once the output tool is
// called (output.go), that call's input alone, the text before it void;
// or, once another tool is called, the text and the tool calls, the output
// tool's call dropped. When the answer changes from or to the output tool's
// input, what was emitted is void: the turn emits a Discard and the
// answer's deltas so far.
type turn struct {
	req  provider.Request
	out  output
	emit func(provider.Delta) // nil: Complete, which streams nothing

	blocks  map[int64]*block
	content bool             // a text or tool_use block came
	events  []provider.Delta // the text and tool call pieces, in order
	answer  []provider.Delta // the output tool's input, as Text pieces
	calls   int              // tool calls (not the output tool's)
	output  bool             // the output tool was called
	mode    answerMode       // what the deltas emitted are
	emitted int              // how many of them since the last Discard
}

// answerMode is what an answer is, by what came so far.
type answerMode int

const (
	answerText   answerMode = iota // text only
	answerOutput                   // the output tool's input
	answerTools                    // text and tool calls
)

// blockKind is what a content block is to the answer.
type blockKind int

const (
	blockIgnored blockKind = iota // thinking, server tools, a dropped output call
	blockText
	blockCall
	blockOutput
)

// block is a content block of the answer.
type block struct {
	kind blockKind
	call int        // blockCall: the tool call's index
	text outputText // blockOutput: its input's decoder
}

func newTurn(req provider.Request, out output, emit func(provider.Delta)) *turn {
	return &turn{req: req, out: out, emit: emit, blocks: map[int64]*block{}}
}

// start begins content block index of type typ: a text block with its
// text, a tool_use block with its id, name and input so far.
func (t *turn) start(index int64, typ, text, id, name, input string) error {
	b := &block{}
	t.blocks[index] = b
	switch typ {
	case "text":
		t.content = true
		b.kind = blockText
		t.event(provider.Delta{Text: text})
	case "tool_use":
		t.content = true
		switch {
		case name == "":
			return fmt.Errorf("anthropic model %s: malformed response: tool_use block %d has no name", t.req.Model.Name, index)
		case t.out.offered && name == provider.OutputToolName:
			if t.output || t.calls > 0 {
				return nil // not the answer: with tool calls, or a second one
			}
			t.output = true
			b.kind = blockOutput
			b.text.unwrap = t.out.wrapped
			t.piece(b.text.write(input))
		default:
			b.kind, b.call = blockCall, t.calls
			t.calls++
			t.event(provider.Delta{ToolCall: &provider.ToolCallDelta{Index: b.call, ID: id, Name: name, Arguments: input}})
		}
	}
	t.flush()
	return nil
}

// delta is a piece of content block index: typ text_delta's text, or
// input_json_delta's partial JSON.
func (t *turn) delta(index int64, typ, text, partialJSON string) error {
	b := t.blocks[index]
	if b == nil {
		return fmt.Errorf("content_block_delta for block %d, which did not start", index)
	}
	switch {
	case b.kind == blockText && typ == "text_delta" && text != "":
		t.event(provider.Delta{Text: text})
	case b.kind == blockCall && typ == "input_json_delta" && partialJSON != "":
		t.event(provider.Delta{ToolCall: &provider.ToolCallDelta{Index: b.call, Arguments: partialJSON}})
	case b.kind == blockOutput && typ == "input_json_delta":
		t.piece(b.text.write(partialJSON))
	}
	t.flush()
	return nil
}

// event adds a text or tool call piece.
func (t *turn) event(d provider.Delta) {
	if d.Text != "" || d.ToolCall != nil {
		t.events = append(t.events, d)
	}
}

// piece adds a piece of the answer's text from the output tool's input.
func (t *turn) piece(s string) {
	if s != "" {
		t.answer = append(t.answer, provider.Delta{Text: s})
	}
}

// visible are the deltas of the answer so far.
func (t *turn) visible() []provider.Delta {
	if t.mode == answerOutput {
		return t.answer
	}
	return t.events
}

// flush emits what the answer gained, after a Discard when it changed
// from or to the output tool's input.
func (t *turn) flush() {
	m := answerText
	switch {
	case t.calls > 0:
		m = answerTools
	case t.output:
		m = answerOutput
	}
	if m != t.mode && (m == answerOutput || t.mode == answerOutput) {
		if t.emitted > 0 {
			t.send(provider.Delta{Discard: true})
		}
		t.emitted = 0
	}
	t.mode = m
	for v := t.visible(); t.emitted < len(v); t.emitted++ {
		t.send(v[t.emitted])
	}
}

func (t *turn) send(d provider.Delta) {
	if t.emit != nil {
		t.emit(d)
	}
}

// empty says whether no text or tool_use block came.
func (t *turn) empty() bool { return !t.content }

// response is the answer's content and tool calls: what its deltas add
// up to.
func (t *turn) response() envelope.ModelResponse {
	return provider.Accumulate(t.req.Iteration, t.visible()...)
}
