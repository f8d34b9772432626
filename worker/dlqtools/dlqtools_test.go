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
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/stack"
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
	// The tools run on a connection of the operations identity to the
	// pipeline's server (every role there with its own nkey), which exists
	// once the environment runs: they get it through late, set right after.
	late := &lateJS{}
	env := workertest.StartWith(t, workertest.Options{Policy: envelope.Policy{ApprovalTimeoutS: 60}, Stack: stack.Options{Identities: true}},
		worker.Config{Queue: dlqtools.Queue}, dlqtools.Tools(late)...)
	js := env.Stack.JS // the operator's
	late.JetStream = connectOperations(t, env)

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
	approveNext(t, js, func() { fixed.Store(true) }) // the cause is fixed before the operator approves
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

// connectOperations connects as the operations role, with the seed the
// stack's identities hold (what toolwire identities writes).
func connectOperations(t *testing.T, env *workertest.Env) jetstream.JetStream {
	t.Helper()
	js, err := dlqtools.Connect(env.Stack.URL, env.Stack.Identities.SeedFile(identity.Operations))
	require.NoError(t, err)
	t.Cleanup(js.Conn().Close)
	return js
}

// TestACommandIsNotReplayed: a dead-lettered command (here an approval
// decision) is refused by replay_dlq_event, once approved, with the reason
// and what an operator runs instead, and stays a dead letter; the server refuses the operations identity's publish of it too,
// and every stream but the dead letters' is out of its reach.
func TestACommandIsNotReplayed(t *testing.T) {
	late := &lateJS{}
	env := workertest.StartWith(t, workertest.Options{Policy: envelope.Policy{ApprovalTimeoutS: 60}, Stack: stack.Options{Identities: true}},
		worker.Config{Queue: dlqtools.Queue}, dlqtools.Tools(late)...)
	js := env.Stack.JS
	ops := connectOperations(t, env)
	late.JetStream = ops

	// A decision that a consumer refuses as permanent.
	r, err := consume.NewRunner(js, consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "ops-cmd", Filters: []string{"toolwire.call." + eventstest.RunID + ".*.decided"}, MaxDeliver: 1},
		Handler: func(context.Context, *consume.Delivery) error {
			return consume.Permanent(errors.New("refused"))
		},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(t.Context()))
	eventstest.StopAtCleanup(t, r)
	call := strings.Repeat("ab", 32)
	decided, err := events.NewDecided("/toolwire/cli", events.Decision{RunID: eventstest.RunID, CallID: call, Decision: events.DecisionApprove, By: "oncall"},
		envelope.Tenant{OrgID: "acme"}, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(js).Publish(t.Context(), decided))
	var dl consume.DeadLetter
	servicetest.PollUntil(t, 10*time.Second, "the decision is dead-lettered", func() bool {
		dls, err := consume.ListDeadLetters(t.Context(), ops, consume.DeadLetterFilter{Consumer: "ops-cmd"})
		require.NoError(t, err)
		if len(dls) == 1 {
			dl = dls[0]
		}
		return len(dls) == 1
	})

	approveNext(t, js, func() {})
	res := env.Run(
		workertest.Calls(workertest.Call("replay_dlq_event", dlqtools.ReplayIn{Seq: dl.Seq, Reason: "try again"})),
		workertest.Answer("refused"),
	)
	require.Equal(t, events.StatusCompleted, res.Status, res.Reason)
	out := res.Envelopes("replay_dlq_event")[0]
	require.NotNil(t, out.Error)
	require.Equal(t, envelope.CodeValidation, out.Error.Code)
	require.Contains(t, out.Error.Message, "is a command")
	require.Contains(t, out.Error.Message, "toolwire dlq replay")
	got, err := consume.GetDeadLetter(t.Context(), ops, dl.Seq)
	require.NoError(t, err, "still a dead letter")
	require.Equal(t, dl.Subject, got.Subject)

	// The server's side: the same publish, and what lies beyond the DLQ.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = ops.PublishMsg(ctx, &nats.Msg{Subject: dl.Subject, Data: got.Data, Header: nats.Header{}})
	require.Error(t, err, "the server refuses a decision from the operations identity")
	_, err = ops.Stream(t.Context(), events.StreamCalls)
	require.Error(t, err, "the calls stream is not the operations identity's to read")
	_, err = ops.KeyValue(t.Context(), provision.BucketSecrets)
	require.Error(t, err, "nor the sealed secrets")
	_, err = ops.Stream(t.Context(), events.StreamDLQ)
	require.NoError(t, err, "the dead letters are")
}

// approveNext approves the next call that asks for an operator, as an
// operator would, after before.
func approveNext(t *testing.T, js jetstream.JetStream, before func()) {
	t.Helper()
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
			before()
			out, err := events.NewDecided("/toolwire/cli", events.Decision{RunID: ar.RunID, CallID: ar.CorrelationID, Decision: events.DecisionApprove, By: "oncall"},
				ar.Tenant, events.RunTrace{})
			if err == nil {
				_ = publish.NewPublisher(js).Publish(context.Background(), out)
			}
		case <-time.After(30 * time.Second):
		}
	}()
}

// lateJS is a JetStream set after the tools are made.
type lateJS struct{ jetstream.JetStream }
