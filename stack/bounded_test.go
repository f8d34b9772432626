package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
)

// TestLongRunWithLargeOutputsStaysBounded: a run of 50 turns whose tools
// return 10 MiB in all (several outputs of 300 KiB to 2 MiB among small
// ones) completes, and no KV value and no stored event grows with it: the
// largest of each stays under 256 KiB. The run state holds what the loop
// needs; envelopes live in their completed events; big outputs are blobs.
func TestLongRunWithLargeOutputsStaysBounded(t *testing.T) {
	const turns, limit = 50, 256 << 10
	big := []int{300 << 10, 2 << 20, 1 << 20, 2 << 20, 1536 << 10, 2 << 20, 1536 << 10}
	sizes := make([]int, turns)
	total := 0
	for i := range sizes {
		sizes[i] = 2 << 10
		if i%7 == 3 && i/7 < len(big) {
			sizes[i] = big[i/7]
		}
		total += sizes[i]
	}
	require.GreaterOrEqual(t, total, 10<<20, "10 MiB of outputs in all")

	blob := newStackTool("bulk", envelope.ToolMetadata{
		Category: envelope.CategoryData, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone,
	}, func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		var a struct {
			Bytes int `json:"bytes"`
		}
		if err := json.Unmarshal(in, &a); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"data": strings.Repeat("x", a.Bytes)})
	})
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(blob)}})

	script := make([]map[string]any, 0, turns+1)
	for i, n := range sizes {
		script = append(script, map[string]any{"tool_calls": []any{call("bulk", map[string]any{"bytes": n, "turn": i + 1})}})
	}
	script = append(script, map[string]any{"content": "read it all"})
	req := orchestratortest.Scripted(t, "bounded-50", []string{"bulk@1.0.0"},
		envelope.Policy{MaxIterations: turns + 1, MaxToolCalls: turns}, script...)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, req))
	final, err := st.Client.Follow(ctx, req.RunID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "read it all", final.Outputs.Response)
	require.NotNil(t, final.OutputsBlob, "50 envelopes make the completed event too large: its outputs are a blob")
	require.Len(t, final.Outputs.ToolOrder, turns)
	whole := 0
	for i, id := range final.Outputs.ToolOrder {
		env := final.Outputs.ToolsByID[id]
		require.Nil(t, env.Error, "call %d", i+1)
		if sizes[i] > 64<<10 {
			require.True(t, env.Truncated, "call %d: a %d-byte output is a blob, its envelope a preview", i+1, sizes[i])
			require.NotEmpty(t, env.Attachments)
			whole += int(env.Attachments[0].Bytes)
		} else {
			whole += len(env.Output)
		}
	}
	require.Greater(t, whole, 10<<20, "every output kept whole, inline or in its blob")

	// Every message the run left at the server: events and KV values.
	largestEvent, largestKV := largestMessages(ctx, t, st.JS)
	t.Logf("largest stored event %d bytes (%s); largest KV value %d bytes (%s)",
		largestEvent.size, largestEvent.subject, largestKV.size, largestKV.subject)
	require.Less(t, largestEvent.size, limit, largestEvent.subject)
	require.Less(t, largestKV.size, limit, largestKV.subject)
}

type sized struct {
	size    int
	subject string
}

// largestMessages returns the largest message (data and headers) of
// toolwire's event streams and of every KV bucket, every revision included.
func largestMessages(ctx context.Context, t *testing.T, js jetstream.JetStream) (event, kv sized) {
	t.Helper()
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		isKV := strings.HasPrefix(name, "KV_")
		if !isKV && !strings.HasPrefix(name, "TOOLWIRE_") {
			continue // the object store's chunks are blobs, not values
		}
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			n := len(m.Data)
			for k, vs := range m.Header {
				for _, v := range vs {
					n += len(k) + len(v)
				}
			}
			at := &event
			if isKV {
				at = &kv
			}
			if n > at.size {
				*at = sized{n, fmt.Sprintf("%s seq %d %s", name, seq, m.Subject)}
			}
		}
	}
	require.NoError(t, names.Err())
	return event, kv
}
