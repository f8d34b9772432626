package provider

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Helpers of the streaming adapters (Streamer) and of their callers: adding
// up a streamed answer's deltas, and retrying a stream that breaks.

// Sum adds up the deltas of a streamed answer the way Streamer defines
// them: the texts joined, each tool call's pieces joined, and a Discard
// empties it. The zero Sum is empty and ready to use; a Sum is not safe for
// concurrent use.
type Sum struct {
	text  strings.Builder
	calls map[int]*callSum
}

// callSum is one tool call of a Sum.
type callSum struct {
	id, name string
	args     strings.Builder
}

// Add adds d to the sum. A Discard empties it (and adds nothing: a Delta
// is one of the three), a Text is appended to the
// content, and a ToolCall piece to its call's (by Index): its ID and Name
// where the call has none yet, its Arguments to the call's arguments.
func (s *Sum) Add(d Delta) {
	if d.Discard {
		s.text.Reset()
		s.calls = nil
		return
	}
	s.text.WriteString(d.Text)
	if tc := d.ToolCall; tc != nil {
		if s.calls == nil {
			s.calls = map[int]*callSum{}
		}
		c := s.calls[tc.Index]
		if c == nil {
			c = &callSum{}
			s.calls[tc.Index] = c
		}
		if c.id == "" {
			c.id = tc.ID
		}
		if c.name == "" {
			c.name = tc.Name
		}
		c.args.WriteString(tc.Arguments)
	}
}

// Content is the texts added since the last Discard, joined.
func (s *Sum) Content() string { return s.text.String() }

// ToolCalls are the tool calls added since the last Discard, in the order
// of their indexes (nil for none), as Complete makes them: the ID, or
// CallID's stable one of the call's position in iteration when it came
// without one, and the arguments' text made JSON by ArgumentsJSON.
func (s *Sum) ToolCalls(iteration int) []envelope.ToolCall {
	if len(s.calls) == 0 {
		return nil
	}
	idx := make([]int, 0, len(s.calls))
	for i := range s.calls {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := make([]envelope.ToolCall, 0, len(idx))
	for pos, i := range idx {
		c := s.calls[i]
		out = append(out, envelope.ToolCall{
			ID:        CallID(c.id, iteration, pos),
			Name:      c.name,
			Arguments: ArgumentsJSON(c.args.String()),
		})
	}
	return out
}

// Response is the sum as the answer of model call iteration: its Content
// and ToolCalls (the stream's stop reason and usage are not deltas).
func (s *Sum) Response(iteration int) envelope.ModelResponse {
	return envelope.ModelResponse{Content: s.Content(), ToolCalls: s.ToolCalls(iteration)}
}

// Accumulate is what deltas, in order, add up to as the answer of model
// call iteration (Sum.Response): what a Streamer's Stream returns, but for
// its stop reason and usage.
func Accumulate(iteration int, deltas ...Delta) envelope.ModelResponse {
	var s Sum
	for _, d := range deltas {
		s.Add(d)
	}
	return s.Response(iteration)
}

// Broken marks err as the failure of a stream after it started (an error
// event, a dropped connection, a chunk that does not decode, a stream that
// ends before its end), which RetryStream retries; nil stays nil.
func Broken(err error) error {
	if err == nil {
		return nil
	}
	return &broken{err: err}
}

// broken is a stream's failure after it started.
type broken struct{ err error }

func (e *broken) Error() string { return e.err.Error() }
func (e *broken) Unwrap() error { return e.err }

// RetryStream runs a streamed model call: attempt makes one request and
// streams its answer to onDelta. When attempt fails with an error Broken
// marks and ctx is not done, RetryStream calls onDelta with a Discard and
// attempt again, at most retries times more (at once: the SDKs' back-off
// covers failures before a stream starts). Any other failure, or the
// cancellation of ctx, ends the call. The error returned is the last
// attempt's, without the mark.
func RetryStream(ctx context.Context, retries int, onDelta func(Delta), attempt func() (envelope.ModelResponse, error)) (envelope.ModelResponse, error) {
	for n := 0; ; n++ {
		resp, err := attempt()
		var b *broken
		if !errors.As(err, &b) {
			return resp, err
		}
		if ctx.Err() != nil || n >= retries {
			if ctx.Err() != nil && !errors.Is(b.err, ctx.Err()) {
				return envelope.ModelResponse{}, fmt.Errorf("%w: %w", context.Cause(ctx), b.err)
			}
			return envelope.ModelResponse{}, b.err
		}
		if onDelta != nil {
			onDelta(Delta{Discard: true})
		}
	}
}
