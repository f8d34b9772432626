package openai

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Stream implements provider.Streamer: the request of Complete with
// "stream": true and stream_options include_usage (the usage comes in the
// last chunk), its chunks' content and tool_calls pieces passed to onDelta
// as they arrive. Tool calls are numbered from 0 in the order they first
// appear. A stream that breaks after it started (an error chunk, a dropped
// connection, a chunk that does not decode, an end without a
// finish_reason) is requested again after a Discard, as often as the
// configuration's MaxRetries says; failures before it starts are the SDK's
// to retry, as in Complete.
func (p *Provider) Stream(ctx context.Context, req provider.Request, onDelta func(provider.Delta)) (envelope.ModelResponse, error) {
	params, err := chatParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	if onDelta == nil {
		onDelta = func(provider.Delta) {}
	}
	var attempts atomic.Int32
	count := option.WithMiddleware(countAttempts(&attempts))
	resp, err := provider.RetryStream(ctx, p.retries, onDelta, func() (envelope.ModelResponse, error) {
		return p.streamOnce(ctx, req, params, onDelta, count)
	})
	if err != nil {
		return envelope.ModelResponse{}, provider.Failure(Name, req.Model.Name, int(attempts.Load()), withMessage(err))
	}
	return resp, nil
}

// streamCall is what a stream told of one tool call so far.
type streamCall struct {
	id, name string
}

// streamOnce makes one streamed request. Its failures after the stream
// started are provider.Broken.
func (p *Provider) streamOnce(ctx context.Context, req provider.Request, params openai.ChatCompletionNewParams,
	onDelta func(provider.Delta), opts ...option.RequestOption) (envelope.ModelResponse, error) {
	stream := p.client.Chat.Completions.NewStreaming(ctx, params, opts...)
	defer func() { _ = stream.Close() }()
	if err := stream.Err(); err != nil {
		// The request failed before its stream started; the SDK retried it.
		return envelope.ModelResponse{}, err
	}
	var (
		sum   provider.Sum
		out   envelope.ModelResponse
		index = map[int64]int{} // the chunks' tool call index: ours
		calls []streamCall
	)
	emit := func(d provider.Delta) {
		sum.Add(d)
		onDelta(d)
	}
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() {
			out.Usage = envelope.Usage{InputTokens: int(chunk.Usage.PromptTokens), OutputTokens: int(chunk.Usage.CompletionTokens)}
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // n is 1: there is no other choice
			}
			if ch.Delta.Content != "" {
				emit(provider.Delta{Text: ch.Delta.Content})
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Type != "" && tc.Type != "function" {
					return envelope.ModelResponse{}, fmt.Errorf("openai model %s: tool call %q has type %q; only function tools are offered", req.Model.Name, tc.ID, tc.Type)
				}
				i, seen := index[tc.Index]
				if !seen {
					i = len(calls)
					index[tc.Index] = i
					calls = append(calls, streamCall{})
				}
				d := provider.ToolCallDelta{Index: i, Arguments: tc.Function.Arguments}
				if c := &calls[i]; c.id == "" && tc.ID != "" {
					c.id, d.ID = tc.ID, tc.ID
				}
				if c := &calls[i]; c.name == "" && tc.Function.Name != "" {
					c.name, d.Name = tc.Function.Name, tc.Function.Name
				}
				if seen && d.ID == "" && d.Name == "" && d.Arguments == "" {
					continue
				}
				emit(provider.Delta{ToolCall: &d})
			}
			if ch.FinishReason != "" {
				out.StopReason = ch.FinishReason
			}
		}
	}
	if err := stream.Err(); err != nil {
		return envelope.ModelResponse{}, provider.Broken(err)
	}
	if out.StopReason == "" {
		return envelope.ModelResponse{}, provider.Broken(errors.New("the stream ended without a finish_reason"))
	}
	for i, c := range calls {
		if c.name == "" {
			return envelope.ModelResponse{}, fmt.Errorf("openai model %s: malformed response: tool call %d has no function name", req.Model.Name, i)
		}
	}
	out.Content = sum.Content()
	out.ToolCalls = sum.ToolCalls(req.Iteration)
	return out, nil
}
