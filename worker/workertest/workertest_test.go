package workertest_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/worker"
	"github.com/toolwire/toolwire/worker/workertest"
)

type textIn struct {
	Text string `json:"text" jsonschema:"the text"`
}

type textOut struct {
	Text string `json:"text"`
}

// TestKit tests worker tools with the kit itself: a run whose model calls a
// worker tool and a built-in at once, the envelopes in AgentOutputs; a
// declared secret reaching the function and scrubbed from what the call
// leaves; a cached tool that runs once for two calls; an output too large
// for an envelope stored as a blob.
func TestKit(t *testing.T) {
	var upperRuns, pageRuns atomic.Int64
	upper := worker.Func(worker.Def{
		Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.",
		SideEffects: worker.SideEffectsNone, Cache: worker.CacheForever,
	}, func(_ context.Context, in textIn) (textOut, error) {
		upperRuns.Add(1)
		return textOut{Text: strings.ToUpper(in.Text)}, nil
	})
	sign := worker.Func(worker.Def{
		Name: "sign", Version: "1.0.0", Description: "Signs a text with the API key.",
		SideEffects: worker.SideEffectsReads, Secrets: []string{"API_KEY"},
	}, func(ctx context.Context, in textIn) (textOut, error) {
		key := worker.CallOf(ctx).Secrets["API_KEY"]
		if key == "" {
			return textOut{}, worker.Errorf(worker.CodeAuthRequired, "no API key")
		}
		return textOut{Text: in.Text + " signed with " + key}, nil
	})
	page := worker.Func(worker.Def{
		Name: "page", Version: "1.0.0", Description: "Returns a long page.",
		SideEffects: worker.SideEffectsReads,
	}, func(_ context.Context, in textIn) (textOut, error) {
		pageRuns.Add(1)
		return textOut{Text: strings.Repeat(in.Text, 100_000)}, nil
	})
	env := workertest.StartWith(t, workertest.Options{Enabled: []string{"echo@1.0.0"}},
		worker.Config{Queue: "kit"}, upper, sign, page)

	res := env.Run(
		workertest.Calls(
			workertest.Call("upper", textIn{Text: "hello"}),
			workertest.Call("echo", map[string]any{"text": "from the executor"}),
		),
		workertest.Answer("both done"),
	)
	require.Equal(t, "completed", res.Status, res.Reason)
	require.Equal(t, "both done", res.Outputs.Response)
	require.Len(t, res.Envelopes(""), 2)
	require.JSONEq(t, `{"text":"HELLO"}`, string(res.Envelopes("upper")[0].Output))
	require.Nil(t, res.Envelopes("echo")[0].Error, "the built-in beside it runs on the default queue")

	// Cached: the second call is answered from the cache.
	again := env.Call("upper", textIn{Text: "hello"})
	require.Nil(t, again.Error)
	require.True(t, again.Cached)
	require.EqualValues(t, 1, upperRuns.Load())

	// A secret: missing, the function never runs (AUTH_REQUIRED); set, it
	// reaches the function and is scrubbed from the output.
	missing := env.Call("sign", textIn{Text: "memo"})
	require.NotNil(t, missing.Error)
	require.Equal(t, envelope.CodeAuthRequired, missing.Error.Code)
	env.SetSecret("API_KEY", "sk-canary-123456")
	signed := env.Call("sign", textIn{Text: "memo"})
	require.Nil(t, signed.Error, "%+v", signed.Error)
	require.NotContains(t, string(signed.Output), "sk-canary-123456")
	require.Contains(t, string(signed.Output), "memo signed with [REDACTED:API_KEY]")

	// A 500 KB output: the envelope keeps a preview, the blob the whole.
	big := env.Call("page", textIn{Text: "abcde"})
	require.Nil(t, big.Error, "%+v", big.Error)
	require.True(t, big.Truncated)
	require.NotEmpty(t, big.Attachments)
	require.EqualValues(t, 1, pageRuns.Load())
}

// TestKitReportsFailedRuns: a run the Policy Guard stops ends as failed with
// its reason, which the Result carries.
func TestKitReportsFailedRuns(t *testing.T) {
	upper := worker.Func(worker.Def{
		Name: "upper", Version: "1.0.0", Description: "Upper-cases a text.", SideEffects: worker.SideEffectsNone,
	}, func(_ context.Context, in textIn) (textOut, error) {
		return textOut{Text: strings.ToUpper(in.Text)}, nil
	})
	env := workertest.StartWith(t, workertest.Options{Policy: envelope.Policy{MaxIterations: 1}},
		worker.Config{Queue: "kit"}, upper)
	res := env.Run(
		workertest.Calls(workertest.Call("upper", textIn{Text: "a"})),
		workertest.Calls(workertest.Call("upper", textIn{Text: "b"})),
		workertest.Answer("never"),
	)
	require.Equal(t, "failed", res.Status)
	require.NotEmpty(t, res.Reason)
}
