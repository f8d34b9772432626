package executor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// TestQueuesRouteCalls: an executor serving the default queue and another
// serving "gpu" each run only the calls approved to their queue, through one
// durable consumer per queue filtered by the queue's subject. A call approved
// to a queue whose executor lacks the tool's implementation is answered with
// a clear error envelope.
func TestQueuesRouteCalls(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)
	// Started at once: each call's started event names the executor that
	// ran it.
	startExecutor(t, env, Config{ID: "ex-default", StartedAfter: -1}, WithTools(newTestTool("only_here", okOutput)))
	gpu := startExecutor(t, env, Config{ID: "ex-gpu", StartedAfter: -1}, WithQueues("gpu"))
	require.Equal(t, []string{"gpu"}, gpu.Config().Queues)
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Name, d.Queue = "gpu_echo", "gpu" // run by the echo built-in, on the gpu queue
	})

	const runID = "run-queues"
	w := watchRun(t, env.JS, runID)
	type call struct {
		req      events.CallRequest
		executor string
	}
	var calls []call
	var reqs []events.CallRequest
	for i := range 10 {
		req := callRequest(t, runID, i+1, "echo", "1.0.0", fmt.Sprintf(`{"text":"default %d"}`, i))
		want := "ex-default"
		if i%2 == 1 {
			req = callRequest(t, runID, i+1, "gpu_echo", "1.0.0", fmt.Sprintf(`{"text":"gpu %d"}`, i))
			req.Queue, want = "gpu", "ex-gpu"
		}
		calls = append(calls, call{req, want})
		reqs = append(reqs, req)
	}
	lost := callRequest(t, runID, 11, "only_here", "1.0.0", `{}`)
	lost.Queue = "gpu"
	calls = append(calls, call{lost, "ex-gpu"})
	publishAllApproved(t, env.JS, append(reqs, lost))

	for _, c := range calls {
		got := w.envelopeOf(t, schemas, c.req)
		require.Equal(t, c.executor, w.executorOf(t, c.req), "%s on queue %s", c.req.Ref(), c.req.Queue)
		if c.req.Name == "only_here" {
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeUnknown, got.Error.Code)
			require.Contains(t, got.Error.Message, `builtin "test_only_here" is not available`)
			continue
		}
		require.Nil(t, got.Error, "%+v", got.Error)
		require.JSONEq(t, string(c.req.Input), string(got.Output))
	}

	require.Equal(t, map[string]string{
		"executor":     "toolwire.call.*.*.approved.default",
		"executor-gpu": "toolwire.call.*.*.approved.gpu",
	}, durableFilters(t, env.JS), "one durable consumer per queue, filtered to it")
	require.Equal(t, Durable, DurableFor(envelope.DefaultQueue))
	require.Equal(t, "executor-gpu", DurableFor("gpu"))
}

// TestReplicasOfSeveralQueues: replicas that serve several queues share each
// queue's consumer, and every call of every queue completes once.
func TestReplicasOfSeveralQueues(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	for _, id := range []string{"multi-a", "multi-b"} {
		startExecutor(t, env, Config{ID: id, Concurrency: 2}, WithQueues("default", "batch"))
	}
	const runID = "run-multi"
	w := watchRun(t, env.JS, runID)
	var reqs []events.CallRequest
	for i := range 12 {
		req := callRequest(t, runID, i+1, "calculator", "1.0.0", fmt.Sprintf(`{"expression":"%d+1"}`, i))
		if i%3 == 0 {
			req.Queue = "batch"
		}
		reqs = append(reqs, req)
	}
	publishAllApproved(t, env.JS, reqs)
	for i, req := range reqs {
		got := w.envelopeOf(t, schemas, req)
		require.Nil(t, got.Error)
		require.JSONEq(t, fmt.Sprintf(`{"result":%d}`, i+1), string(got.Output))
	}
	for _, req := range reqs {
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
	}
	require.Equal(t, map[string]string{
		"executor":       "toolwire.call.*.*.approved.default",
		"executor-batch": "toolwire.call.*.*.approved.batch",
	}, durableFilters(t, env.JS), "the replicas share one consumer per queue")
}
