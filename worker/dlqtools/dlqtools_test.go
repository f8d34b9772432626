package dlqtools_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/worker"
	"github.com/toolwire/toolwire/worker/dlqtools"
	"github.com/toolwire/toolwire/worker/workertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOperationsAgentReplaysADeadLetter: an operations agent (a scripted
// model) lists the dead letters, inspects one (its failure history without
// the password the error held), and replays it; the replay waits for an
// operator (risk high), runs once approved, brings the event back to its
// consumer, and the audit shows the agent's reason.
func TestOperationsAgentReplaysADeadLetter(t *testing.T) {
	// The tools run on the pipeline's JetStream, which exists once the
	// environment runs: they get it through late, set right after.
	late := &lateJS{}
	env := workertest.StartWith(t, workertest.Options{Policy: envelope.Policy{ApprovalTimeoutS: 60}},
		worker.Config{Queue: dlqtools.Queue}, dlqtools.Tools(late)...)
	js := env.Stack.JS
	late.JetStream = js

	// A consumer that dead-letters an event at once, until it is fixed.
	var fixed, handled atomic.Bool
	r, err := consume.NewRunner(js, consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "ops-test", Filters: []string{"toolwire.call." + eventstest.RunID + ".>"}, MaxDeliver: 2},
		Handler: func(context.Context, *consume.Delivery) error {
			if !fixed.Load() {
				return consume.Permanent(errors.New("downstream refused: password=hunter2 for https://u:p@db.example/x"))
			}
			handled.Store(true)
			return nil
		},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(t.Context()))
	eventstest.StopAtCleanup(t, r)
	require.NoError(t, publish.NewPublisher(js).Publish(t.Context(), eventstest.CallStarted(t, 3)))
	var seq uint64
	servicetest.PollUntil(t, 10*time.Second, "the event is dead-lettered", func() bool {
		dls, err := consume.ListDeadLetters(t.Context(), js, consume.DeadLetterFilter{Consumer: "ops-test"})
		require.NoError(t, err)
		if len(dls) == 1 {
			seq = dls[0].Seq
		}
		return len(dls) == 1
	})

	// The run: list, inspect, replay (approved by an operator).
	approvals := make(chan *nats.Msg, 4)
	sub, err := js.Conn().ChanSubscribe("toolwire.call.*.*.approval_required", approvals)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	go func() {
		select {
		case m := <-approvals:
			e, err := events.Decode(m)
			if err != nil {
				return
			}
			var ar events.ApprovalRequest
			if events.DecodeData(e, &ar) != nil {
				return
			}
			fixed.Store(true) // the cause is fixed before the operator approves
			out, err := events.NewDecided("/toolwire/cli", events.Decision{RunID: ar.RunID, CallID: ar.CorrelationID, Decision: events.DecisionApprove, By: "oncall"},
				ar.Tenant, events.RunTrace{})
			if err == nil {
				_ = publish.NewPublisher(js).Publish(context.Background(), out)
			}
		case <-time.After(30 * time.Second):
		}
	}()
	res := env.Run(
		workertest.Calls(workertest.Call("list_dlq_events", dlqtools.ListIn{Consumer: "ops-test"})),
		workertest.Calls(workertest.Call("get_dlq_event_detail", dlqtools.GetIn{Seq: seq})),
		workertest.Calls(workertest.Call("replay_dlq_event", dlqtools.ReplayIn{Seq: seq, Reason: "the downstream quota was raised"})),
		workertest.Answer("replayed"),
	)
	require.Equal(t, events.StatusCompleted, res.Status, res.Reason)
	var listed dlqtools.ListOut
	require.NoError(t, json.Unmarshal(res.Envelopes("list_dlq_events")[0].Output, &listed))
	require.Len(t, listed.DeadLetters, 1)
	require.Equal(t, seq, listed.DeadLetters[0].Seq)
	detail := res.Envelopes("get_dlq_event_detail")[0]
	require.Nil(t, detail.Error)
	require.NotContains(t, string(detail.Output), "hunter2", "the failure history is sanitized")
	require.NotContains(t, string(detail.Output), "u:p@")
	require.Contains(t, string(detail.Output), "password=[redacted]")
	replay := res.Envelopes("replay_dlq_event")[0]
	require.Nil(t, replay.Error, "%+v", replay.Error)

	servicetest.PollUntil(t, 10*time.Second, "the replayed event reaches its consumer", handled.Load)
	audit, err := consume.ListReplays(t.Context(), js)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, seq, audit[0].Seq)
	require.Equal(t, "the downstream quota was raised", audit[0].Reason)
	require.True(t, strings.HasPrefix(audit[0].By, "agent run "), audit[0].By)
}

// TestReplayToolIsGated: replay_dlq_event declares writes and high risk, so
// every autonomy of the default matrix puts its calls to an operator.
func TestReplayToolIsGated(t *testing.T) {
	for _, tl := range dlqtools.Tools(nil) {
		d, err := tl.Definition()
		require.NoError(t, err)
		require.Equal(t, dlqtools.Queue, d.Queue)
		if d.Name == "replay_dlq_event" {
			require.Equal(t, envelope.SideEffectsWrites, d.Metadata.SideEffects)
			r, _ := d.RiskOf(nil)
			require.Equal(t, envelope.RiskHigh, r)
		}
	}
}

// lateJS is a JetStream set after the tools are made.
type lateJS struct{ jetstream.JetStream }
