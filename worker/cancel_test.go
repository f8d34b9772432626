package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/worker"
)

// cancelWait bounds every wait of the cancellation tests: a safety net,
// not a timing assertion.
const cancelWait = 30 * time.Second

type waitIn struct {
	Note string `json:"note,omitempty" jsonschema:"anything"`
}

type waitOut struct {
	Done bool `json:"done"`
}

// waitForCancel is a worker's Go tool of 10 s that blocks until its
// context ends, and says when it started and when its context ended.
func waitForCancel(queue string) (*worker.Tool, <-chan struct{}, <-chan time.Time) {
	entered, stopped := make(chan struct{}, 4), make(chan time.Time, 4)
	return worker.Func(worker.Def{
		Name: "wait_for_cancel", Version: "1.0.0", Description: "Blocks until its context ends.",
		SideEffects: worker.SideEffectsNone, Timeout: 10 * time.Second, Queue: queue,
	}, func(ctx context.Context, _ waitIn) (waitOut, error) {
		entered <- struct{}{}
		<-ctx.Done()
		stopped <- time.Now()
		return waitOut{}, ctx.Err()
	}), entered, stopped
}

func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(cancelWait):
		t.Fatalf("%s: nothing within %s", what, cancelWait)
	}
	var zero T
	return zero
}

// cancelSetup is the NATS server, the executor's connection and the
// workers' connections of one case.
type cancelSetup struct {
	// operator publishes what the policy and the canceller would, and
	// reads the streams.
	operator, executor, workerA jetstream.JetStream
	// observeB, with identities, is a client of another queue's worker
	// identity (queue "other"): what it may subscribe to, and what reaches
	// its account.
	observeB func(t *testing.T) (seen func() []string)
}

// openServer is a server that lets anyone in.
func openServer(t *testing.T, _ string) cancelSetup {
	env := eventstest.Start(t)
	return cancelSetup{operator: env.JetStream(t), executor: env.JetStream(t), workerA: env.JetStream(t)}
}

// identityServer is a server that lets in only toolwire's identities, each
// in its account (pkg/service/identity): the executor's role, the worker
// identity of queueA and another of queue "other".
func identityServer(t *testing.T, queueA string) cancelSetup {
	keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
	require.NoError(t, err)
	a, err := identity.ParseWorker(queueA)
	require.NoError(t, err)
	b, err := identity.ParseWorker("other")
	require.NoError(t, err)
	require.NoError(t, keys.AddWorker(a))
	require.NoError(t, keys.AddWorker(b))
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	connect := func(opts []nats.Option, err error, more ...nats.Option) *nats.Conn {
		t.Helper()
		require.NoError(t, err)
		nc, err := nats.Connect(s.ClientURL(), append(opts, more...)...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	js := func(nc *nats.Conn) jetstream.JetStream {
		j, err := jetstream.New(nc)
		require.NoError(t, err)
		return j
	}
	op := js(connect(identity.ConnectOptions(identity.Operator, keys.SeedFile(identity.Operator))))
	require.NoError(t, provision.Provision(t.Context(), op, provision.StoreConfig{Replicas: 1}))
	return cancelSetup{
		operator: op,
		executor: js(connect(identity.ConnectOptions(identity.Executor, keys.SeedFile(identity.Executor)))),
		workerA:  js(connect(identity.WorkerConnectOptions(keys.WorkerSeedFile(a)))),
		observeB: func(t *testing.T) func() []string {
			denied := make(chan string, 8)
			nc := connect(identity.WorkerConnectOptions(keys.WorkerSeedFile(b)))
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err.Error() })
			// Another queue's cancels are not its to receive.
			for _, subj := range []string{"toolwire.worker." + queueA + ".cancel", "toolwire.worker.*.cancel", "toolwire.worker.>"} {
				_, err := nc.Subscribe(subj, func(*nats.Msg) {})
				require.NoError(t, err)
				require.NoError(t, nc.Flush())
				require.Contains(t, within(t, denied, "refusal of "+subj), "Permissions Violation for Subscription to \""+subj+"\"")
			}
			// What it may receive: its own queue's subjects.
			var mu sync.Mutex
			var seen []string
			_, err := nc.Subscribe("toolwire.worker.other.*", func(m *nats.Msg) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, m.Subject)
			})
			require.NoError(t, err)
			require.NoError(t, nc.Flush())
			return func() []string {
				require.NoError(t, nc.Flush())
				mu.Lock()
				defer mu.Unlock()
				return append([]string(nil), seen...)
			}
		},
	}
}

// TestCancelStopsAWorkersCall: a call handed to a user's worker (a Go tool
// of 10 s that blocks until its context ends) is stopped by its run's
// cancel request: the executor answers it at once, TIMEOUT with
// details.cancelled, and tells the worker, whose tool's context ends. On a
// server with toolwire's identities, the cancel of queue A's call reaches
// only queue A's worker account: the worker identity of another queue may
// not subscribe to it, and nothing of it reaches its account.
func TestCancelStopsAWorkersCall(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, queue string) cancelSetup
	}{
		{"open server", openServer},
		{"identities", identityServer},
	} {
		t.Run(c.name, func(t *testing.T) {
			const queue = "slow"
			setup := c.setup(t, queue)
			var seenByB func() []string
			if setup.observeB != nil {
				seenByB = setup.observeB(t)
			}
			log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			exe, err := executor.New(service.Deps{JS: setup.executor, Log: log, Metrics: prometheus.NewRegistry()},
				executor.Config{ID: "executor-cancel"})
			require.NoError(t, err)
			require.NoError(t, exe.Start(t.Context()))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
				defer cancel()
				require.NoError(t, exe.Stop(ctx))
			})
			tool, entered, stopped := waitForCancel(queue)
			reg := prometheus.NewRegistry()
			w := worker.New(worker.Config{Queue: queue, Logger: log, Metrics: reg, Getenv: func(string) string { return "" }}, tool)
			require.NoError(t, w.Start(t.Context(), setup.workerA))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
				defer cancel()
				require.NoError(t, w.Stop(ctx))
			})

			const runID = "run-worker-cancel"
			tenant := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws"}
			input := json.RawMessage(`{}`)
			callID, err := envelope.CallID("wait_for_cancel", "1.0.0", input, 1)
			require.NoError(t, err)
			approved, err := events.NewCallApproved("/test", events.CallRequest{
				RunID: runID, CallID: callID, Seq: 1, Iteration: 1, Name: "wait_for_cancel", Version: "1.0.0",
				Input: input, Tenant: tenant, Agent: "tester", Queue: queue,
			}, events.RunTrace{})
			require.NoError(t, err)
			pub := publish.NewPublisher(setup.operator)
			require.NoError(t, pub.Publish(t.Context(), approved))
			within(t, entered, "the worker's tool runs")

			cancelReq, err := events.NewCancelRequested("/test", events.CancelRequest{
				RunID: runID, Reason: "changed my mind", By: "tester", Tenant: tenant,
			}, events.RunTrace{})
			require.NoError(t, err)
			completed, err := events.CallSubject(runID, callID, events.VerbCompleted)
			require.NoError(t, err)
			sent := time.Now()
			require.NoError(t, pub.Publish(t.Context(), cancelReq))
			stoppedAt := within(t, stopped, "the worker's tool's context ends")
			ev, _, err := eventstest.NextEvent(t.Context(), setup.operator, events.StreamCalls, cancelWait, completed)
			require.NoError(t, err)
			took := time.Since(sent)
			t.Logf("%s: cancel to the worker's tool's context ended %s, to the envelope stored %s", c.name, stoppedAt.Sub(sent), took)
			var env envelope.ToolEnvelope
			require.NoError(t, events.DecodeData(ev, &env))
			require.NotNil(t, env.Error)
			require.Equal(t, envelope.CodeTimeout, env.Error.Code)
			require.True(t, events.IsCancelledCall(env.Error), "details say cancelled: %+v", env.Error.Details)
			require.Equal(t, "stopped: the run was cancelled by tester: changed my mind", env.Error.Message)
			require.Less(t, took, 5*time.Second, "the worker is freed at the cancel, not at the tool's 10 s timeout")
			// The worker counts the call by its outcome: stopped, TIMEOUT.
			require.Eventually(t, func() bool {
				return servicetest.CounterSum(t, reg, "toolwire_worker_tool_calls_total",
					map[string]string{"tool": "wait_for_cancel@1.0.0", "code": "TIMEOUT"}) == 1
			}, cancelWait, 10*time.Millisecond)

			if seenByB != nil {
				for _, subj := range seenByB() {
					require.False(t, strings.HasSuffix(subj, ".cancel"), "the other queue's worker received %s", subj)
				}
				require.Empty(t, seenByB(), "nothing of queue %s reaches another worker's account", queue)
			}
		})
	}
}
