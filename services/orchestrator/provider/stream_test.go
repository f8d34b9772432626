package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

func call(i int, id, name, args string) provider.Delta {
	return provider.Delta{ToolCall: &provider.ToolCallDelta{Index: i, ID: id, Name: name, Arguments: args}}
}

func TestAccumulate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		deltas []provider.Delta
		want   envelope.ModelResponse
	}{
		{name: "nothing"},
		{name: "texts joined", deltas: []provider.Delta{{Text: "Hel"}, {Text: "lo"}, {Text: ", world"}},
			want: envelope.ModelResponse{Content: "Hello, world"}},
		{name: "interleaved calls, by index",
			deltas: []provider.Delta{
				{Text: "Both: "},
				call(1, "call_b", "calculator", ""), call(0, "call_a", "echo", `{"te`),
				call(1, "", "", `{"expression": "1+1"}`), call(0, "", "", `xt": "hi"}`),
			},
			want: envelope.ModelResponse{Content: "Both: ", ToolCalls: []envelope.ToolCall{
				{ID: "call_a", Name: "echo", Arguments: json.RawMessage(`{"text": "hi"}`)},
				{ID: "call_b", Name: "calculator", Arguments: json.RawMessage(`{"expression": "1+1"}`)},
			}}},
		{name: "a Discard voids what came before",
			deltas: []provider.Delta{{Text: "broken "}, call(0, "call_x", "echo", `{"te`), {Discard: true}, {Text: "whole"}},
			want:   envelope.ModelResponse{Content: "whole"}},
		{name: "as Complete makes calls: an id when none came, {} for no arguments, a string for broken ones",
			deltas: []provider.Delta{call(0, "", "echo", ""), call(1, "", "echo", `{"text": "unterminated`)},
			want: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{
				{ID: "call_2_1", Name: "echo", Arguments: json.RawMessage(`{}`)},
				{ID: "call_2_2", Name: "echo", Arguments: json.RawMessage(`"{\"text\": \"unterminated"`)},
			}}},
		{name: "the first id and name stand", deltas: []provider.Delta{call(0, "call_1", "echo", ""), call(0, "call_2", "other", "{}")},
			want: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{}`)}}}},
		{name: "an id or name may come after the first piece", deltas: []provider.Delta{call(0, "", "", `{}`), call(0, "call_1", "echo", "")},
			want: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{}`)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, provider.Accumulate(2, tc.deltas...))
			var s provider.Sum
			for _, d := range tc.deltas {
				s.Add(d)
			}
			require.Equal(t, tc.want, s.Response(2))
			require.Equal(t, tc.want.Content, s.Content())
			require.Equal(t, tc.want.ToolCalls, s.ToolCalls(2))
		})
	}
}

// However a call's arguments are cut into pieces, they add up to the same
// call.
func FuzzSumArguments(f *testing.F) {
	f.Add(`{"text": "hi"}`, []byte{2, 9})
	f.Add(`{"a": `, []byte{1})
	f.Add("", []byte{})
	f.Fuzz(func(t *testing.T, args string, cuts []byte) {
		var s provider.Sum
		s.Add(call(0, "call_1", "echo", ""))
		at := 0
		for _, c := range cuts {
			end := max(at, int(c)%(len(args)+1))
			s.Add(call(0, "", "", args[at:end]))
			at = end
		}
		s.Add(call(0, "", "", args[at:]))
		want := []envelope.ToolCall{{ID: "call_1", Name: "echo", Arguments: provider.ArgumentsJSON(args)}}
		require.Equal(t, want, s.ToolCalls(1))
	})
}

func TestRetryStream(t *testing.T) {
	errBroken := errors.New("stream broke")
	errOther := errors.New("malformed answer")
	ok := envelope.ModelResponse{Content: "ok"}
	for _, tc := range []struct {
		name     string
		retries  int
		results  []error // of the attempts in turn; nil succeeds
		attempts int
		discards int
		err      error
	}{
		{name: "success", retries: 2, results: []error{nil}, attempts: 1},
		{name: "broken, then success", retries: 2, results: []error{provider.Broken(errBroken), nil}, attempts: 2, discards: 1},
		{name: "broken every time", retries: 2, results: []error{provider.Broken(errBroken), provider.Broken(errBroken), provider.Broken(errBroken)},
			attempts: 3, discards: 2, err: errBroken},
		{name: "no retries", retries: 0, results: []error{provider.Broken(errBroken)}, attempts: 1, err: errBroken},
		{name: "another failure is not retried", retries: 2, results: []error{errOther}, attempts: 1, err: errOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, discards := 0, 0
			resp, err := provider.RetryStream(t.Context(), tc.retries, func(d provider.Delta) {
				require.True(t, d.Discard)
				discards++
			}, func() (envelope.ModelResponse, error) {
				err := tc.results[n]
				n++
				if err != nil {
					return envelope.ModelResponse{}, err
				}
				return ok, nil
			})
			require.Equal(t, tc.attempts, n)
			require.Equal(t, tc.discards, discards)
			if tc.err != nil {
				require.Equal(t, tc.err, err, "the attempt's error, without the mark")
				return
			}
			require.NoError(t, err)
			require.Equal(t, ok, resp)
		})
	}
}

func TestRetryStreamCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	n := 0
	_, err := provider.RetryStream(ctx, 3, nil, func() (envelope.ModelResponse, error) {
		n++
		cancel()
		return envelope.ModelResponse{}, provider.Broken(errors.New("read: connection reset"))
	})
	require.Equal(t, 1, n, "a canceled call is not retried")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "connection reset")
	require.NoError(t, provider.Broken(nil))
}
