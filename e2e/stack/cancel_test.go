package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/stack"
)

// TestCancelEndToEnd (issue 31): a run whose turn has a quick call and two
// 10 s calls (one reads, one writes) is cancelled while the slow ones run.
// Their tools' contexts are cancelled at once, the run ends cancelled with
// the quick call's envelope and the two cut short (TIMEOUT, saying so), the
// writes tool ran once, and nothing of the run follows its end.
func TestCancelEndToEnd(t *testing.T) {
	started := make(chan string, 2)
	stopped := make(chan time.Time, 2)
	slow := func(name string) func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		return func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			started <- name
			select {
			case <-ctx.Done():
				stopped <- time.Now()
				return nil, ctx.Err()
			case <-time.After(10 * time.Second):
				return json.RawMessage(`{"done":true}`), nil
			}
		}
	}
	reader := newStackTool("slow_read", envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone}, slow("slow_read"))
	writer := newStackTool("slow_write", envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone}, slow("slow_write"))
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(reader, writer)}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	req := scripted(t, "cancel-e2e", []string{"echo@1.0.0", "slow_read@1.0.0", "slow_write@1.0.0"},
		map[string]any{"tool_calls": []any{
			call("echo", map[string]any{"text": "quick"}),
			call("slow_read", map[string]any{"q": 1}),
			call("slow_write", map[string]any{"q": 2}),
		}},
		map[string]any{"content": "never asked"},
	)
	require.NoError(t, st.Client.Submit(ctx, req))
	for range 2 {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the slow tools never started")
		}
	}
	asked := time.Now()
	res, err := st.Client.Cancel(ctx, req.RunID, "runaway", "e2e")
	require.NoError(t, err)
	require.Equal(t, client.StatusCancelling, res.Status)
	for range 2 {
		select {
		case at := <-stopped:
			t.Logf("a slow tool was stopped %s after the cancel", at.Sub(asked).Round(time.Millisecond))
			require.Less(t, at.Sub(asked), 5*time.Second, "stopped long before its 10 s")
		case <-ctx.Done():
			t.Fatal("a slow tool was not stopped")
		}
	}
	final, err := st.Client.Wait(ctx, req.RunID)
	require.ErrorIs(t, err, client.ErrRunCancelled)
	t.Logf("the run ended %s after the cancel", time.Since(asked).Round(time.Millisecond))
	require.Equal(t, events.StatusCancelled, final.Status)
	require.Equal(t, "cancelled by e2e: runaway", final.Reason)
	require.Len(t, final.Outputs.ToolOrder, 3)
	for _, id := range final.Outputs.ToolOrder {
		env := final.Outputs.ToolsByID[id]
		if env.Name == "echo" {
			require.Nil(t, env.Error, "the quick call completed")
			continue
		}
		require.NotNil(t, env.Error, env.Name)
		require.Equal(t, envelope.CodeTimeout, env.Error.Code, env.Name)
		require.True(t, events.IsCancelledCall(env.Error), "%s: %+v", env.Name, env.Error)
	}
	require.Equal(t, 1, writer.total(), "the writes call ran once")

	time.Sleep(time.Second) // anything late would be stored by now
	broken, err := eventstest.AfterEnd(ctx, st.JS)
	require.NoError(t, err)
	require.Empty(t, broken, "nothing of a run follows its end")
}

// TestCancelManyRuns: runs cancelled at every point of their life (before
// their first turn, during it, while their calls run or wait to start) all
// end cancelled, once, with nothing after their end.
func TestCancelManyRuns(t *testing.T) {
	slow := newStackTool("slow_read", envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Second):
				return json.RawMessage(`{"done":true}`), nil
			}
		})
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(slow)}})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const runs = 60
	errs := make(chan error, runs)
	for i := range runs {
		go func() {
			req := scripted(t, fmt.Sprintf("cancel-many-%d", i), []string{"echo@1.0.0", "slow_read@1.0.0"},
				map[string]any{"tool_calls": []any{call("echo", map[string]any{"n": i}), call("slow_read", map[string]any{"n": i})}},
				map[string]any{"content": "never asked"},
			)
			if err := st.Client.Submit(ctx, req); err != nil {
				errs <- err
				return
			}
			time.Sleep(time.Duration(i%6) * 40 * time.Millisecond) // cancelled at every point of the run
			if _, err := st.Client.Cancel(ctx, req.RunID, "", "e2e"); err != nil {
				errs <- err
				return
			}
			final, err := st.Client.Wait(ctx, req.RunID)
			switch {
			case !errors.Is(err, client.ErrRunCancelled):
				errs <- fmt.Errorf("run %s: %v", req.RunID, err)
			case final.Status != events.StatusCancelled:
				errs <- fmt.Errorf("run %s ended %s", req.RunID, final.Status)
			default:
				errs <- nil
			}
		}()
	}
	for range runs {
		require.NoError(t, <-errs)
	}
	time.Sleep(time.Second)
	broken, err := eventstest.AfterEnd(ctx, st.JS)
	require.NoError(t, err)
	require.Empty(t, broken, "nothing of a run follows its end")
}
