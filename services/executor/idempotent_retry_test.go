package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// keyedEndpoint is an http tool's endpoint that deduplicates by
// Idempotency-Key, as a payment API does: the first request of a key does
// the write and then hangs (the executor dies before the answer), any later
// one answers the stored result at once. It counts the requests of each key.
type keyedEndpoint struct {
	mu      sync.Mutex
	byKey   map[string]int
	noKey   int
	entered chan string // the key of each first request, once its write is done
	// gone ends the requests still held (the crashed executor's, which
	// nothing cancels): closed before the server closes.
	gone chan struct{}
}

func (e *keyedEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(envelope.IdempotencyKeyHeader)
	e.mu.Lock()
	if key == "" {
		e.noKey++
	}
	e.byKey[key]++
	n := e.byKey[key]
	e.mu.Unlock()
	if n == 1 {
		e.entered <- key
		select { // the executor is gone before the answer
		case <-r.Context().Done():
		case <-e.gone:
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"temp_c":%d}`, n)
}

func (e *keyedEndpoint) requests(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byKey[key]
}

// startHTTPReplica is an executor on a connection of its own (startReplica's
// crash applies) whose web guard lets it reach host.
func startHTTPReplica(t *testing.T, env *eventstest.Env, id, host string, cfg Config) *replica {
	t.Helper()
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	d := testDeps(t, env, nil)
	d.JS = js
	cfg.ID = id
	s := newExecutor(t, d, cfg, std.withWeb(web.Config{AllowHosts: []string{host}}))
	start(t, s)
	r := &replica{id: id, s: s, nc: nc}
	t.Cleanup(func() {
		if r.stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
	return r
}

// TestIdempotentWritesAreRetriedAfterACrash: an executor killed in the middle
// of a burst of calls to a writes http tool. When the tool declares
// metadata.idempotent, the replica that gets the redeliveries runs each call
// again with the same Idempotency-Key, and it ends OK, attempt 2; the
// endpoint saw each key twice and no request without one. Without the
// declaration, or when too little of the call's timeout is left, every call
// ends UNKNOWN "outcome unknown" and the endpoint saw its key once.
func TestIdempotentWritesAreRetriedAfterACrash(t *testing.T) {
	tests := []struct {
		name       string
		idempotent bool
		timeoutMS  int
		ackWait    time.Duration // default 1s
		retried    bool
		notRetried string // a fragment of details.not_retried of the UNKNOWN envelope
	}{
		{name: "idempotent", idempotent: true, timeoutMS: 60_000, retried: true},
		{name: "not declared", idempotent: false, timeoutMS: 60_000},
		// The redelivery comes after the ack wait, past the call's timeout.
		{name: "idempotent, out of time", idempotent: true, timeoutMS: 1_000, ackWait: 2 * time.Second, notRetried: "0s of the call's 1s timeout is left"},
	}
	const burst = 5
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := eventstest.Start(t)
			schemas := newEventSchemas(t)
			ep := &keyedEndpoint{byKey: map[string]int{}, entered: make(chan string, 4*burst), gone: make(chan struct{})}
			srv := newServer(t, ep.ServeHTTP)
			t.Cleanup(func() { close(ep.gone) }) // before the server closes
			host := srv.Listener.Addr().String()
			cfg := Config{Concurrency: burst, AckWait: cmp.Or(tc.ackWait, time.Second), ClaimLease: 600 * time.Millisecond}

			def := httpDef("pay", envelope.SideEffectsWrites, `{"url":"`+srv.URL+`/pay"}`)
			def.Metadata.Idempotent, def.TimeoutMS = tc.idempotent, tc.timeoutMS
			created, err := openRegistry(t, env.JS).Register(t.Context(), def)
			require.NoError(t, err)
			require.True(t, created)

			a := startHTTPReplica(t, env, "idem-a", host, cfg)
			runID := "run-idem"
			w := watchRun(t, env.JS, runID)
			pub := publish.NewPublisher(env.JS)
			var reqs []events.CallRequest
			for i := range burst {
				req := callRequest(t, runID, i+1, "pay", "1.0.0", fmt.Sprintf(`{"city":"c%d"}`, i))
				reqs = append(reqs, req)
				publishApproved(t, pub, req)
			}
			for range reqs {
				select {
				case <-ep.entered:
				case <-time.After(waitLimit):
					t.Fatal("the endpoint never got every call")
				}
			}
			a.crash()
			b := startHTTPReplica(t, env, "idem-b", host, cfg)

			for _, req := range reqs {
				key := envelope.IdempotencyKey(runID, req.CallID)
				got := w.envelopeOf(t, schemas, req)
				if tc.retried {
					require.Nil(t, got.Error, "%+v", got.Error)
					require.JSONEq(t, `{"temp_c":2}`, string(got.Output), "the endpoint's answer to the second request of the key")
					require.Equal(t, 2, got.Attempt, "the envelope says the tool ran again")
					require.Equal(t, 2, ep.requests(key), "the key at most twice: the crashed run and the retry")
				} else {
					require.NotNil(t, got.Error, "a crashed call has no result")
					require.Equal(t, envelope.CodeUnknown, got.Error.Code)
					require.Equal(t, MsgOutcomeUnknown, got.Error.Message)
					require.Zero(t, got.Attempt)
					require.Equal(t, 1, ep.requests(key), "never run again")
					details, _ := got.Error.Details.(map[string]any)
					if tc.notRetried != "" {
						require.Contains(t, details["not_retried"], tc.notRetried)
					} else {
						require.NotContains(t, details, "not_retried", "a tool without the declaration has no retry to refuse")
					}
				}
				require.False(t, got.TStart.After(got.TEnd))
				require.Equal(t, uint64(1), count(t, env.JS, completedSubject(t, req)), "one envelope per call")
			}
			waitIdle(t, env.JS)
			ep.mu.Lock()
			require.Zero(t, ep.noKey, "every request carried its key")
			require.Len(t, ep.byKey, burst, "one key per call, the same on every attempt")
			ep.mu.Unlock()

			retried := testutil.ToFloat64(b.s.metrics.writeReplays.WithLabelValues("pay@1.0.0", "retried"))
			unknown := testutil.ToFloat64(b.s.metrics.writeReplays.WithLabelValues("pay@1.0.0", "unknown"))
			if tc.retried {
				require.Equal(t, float64(burst), retried)
				require.Zero(t, unknown)
			} else {
				require.Zero(t, retried)
				require.Equal(t, float64(burst), unknown)
			}

			// The outcome record keeps the run and the first run's start.
			kv, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
			require.NoError(t, err)
			e, err := kv.Get(t.Context(), outcomeKey(runID, reqs[0].CallID))
			require.NoError(t, err)
			var rec outcomeRecord
			require.NoError(t, json.Unmarshal(e.Value(), &rec))
			require.Equal(t, outcomeDone, rec.State)
			if tc.retried {
				require.Nil(t, rec.Envelope.Error)
				require.Equal(t, 2, rec.Envelope.Attempt)
			} else {
				require.Equal(t, MsgOutcomeUnknown, rec.Envelope.Error.Message)
			}
		})
	}
}

// A definition that declares idempotent retries for a tool that does not
// write is refused at registration, saying why.
func TestIdempotentNeedsWrites(t *testing.T) {
	env := eventstest.Start(t)
	reg := openRegistry(t, env.JS)
	for _, side := range []envelope.SideEffects{envelope.SideEffectsReads, envelope.SideEffectsNone} {
		def := httpDef("lookup_"+string(side), side, `{"url":"https://api.example.com/lookup"}`)
		def.Metadata.Idempotent = true
		_, err := reg.Register(t.Context(), def)
		require.ErrorIs(t, err, envelope.ErrInvalidTool)
		require.ErrorContains(t, err, fmt.Sprintf(`metadata.idempotent is only for a tool whose side_effects is writes, not %q`, side))
	}
}

// The retry rule: a writes tool that declares idempotent retries runs a call
// again while it has runs, deliveries and time left.
func TestWriteRetryRule(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := &Service{now: func() time.Time { return now }}
	writes := httpDef("pay", envelope.SideEffectsWrites, `{"url":"https://pay.example.com/"}`)
	writes.TimeoutMS = 10_000
	idempotent := writes
	idempotent.Metadata.Idempotent = true
	started := now.Add(-2 * time.Second)
	tests := []struct {
		name     string
		def      envelope.ToolDefinition
		delivery uint64
		rec      outcomeRecord
		want     bool
		why      string // a fragment of the reason, when refused
		noRule   bool
	}{
		{name: "first run cut short", def: idempotent, delivery: 2, rec: outcomeRecord{ClaimedAt: started}, want: true},
		{name: "second run cut short", def: idempotent, delivery: 3, rec: outcomeRecord{ClaimedAt: now, Attempt: 2, Started: started}, want: true},
		{name: "runs used up", def: idempotent, delivery: 4, rec: outcomeRecord{ClaimedAt: now, Attempt: maxWriteRuns, Started: started}, why: "the tool ran 3 times"},
		{name: "last delivery", def: idempotent, delivery: maxDeliver, rec: outcomeRecord{ClaimedAt: started}, why: "delivery 8 is the call's last"},
		{name: "time used up", def: idempotent, delivery: 2, rec: outcomeRecord{ClaimedAt: now.Add(-9500 * time.Millisecond)}, why: "500ms of the call's 10s timeout is left"},
		{name: "timeout counts from the first run", def: idempotent, delivery: 2, rec: outcomeRecord{ClaimedAt: now, Attempt: 2, Started: now.Add(-time.Minute)}, why: "0s of the call's 10s timeout is left"},
		{name: "not declared", def: writes, noRule: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := s.writeRetryRule(&tc.def, tc.delivery)
			if tc.noRule {
				require.Nil(t, rule)
				return
			}
			require.NotNil(t, rule)
			ok, why := rule(tc.rec)
			require.Equal(t, tc.want, ok, why)
			if tc.why != "" {
				require.Contains(t, why, tc.why)
			} else {
				require.Empty(t, why)
			}
		})
	}
	// A retry's run has what is left of the timeout.
	require.Equal(t, 10*time.Second, s.runTimeout(&idempotent, outcomeRecord{ClaimedAt: now}))
	require.Equal(t, 8*time.Second, s.runTimeout(&idempotent, outcomeRecord{ClaimedAt: now, Attempt: 2, Started: started}))
}

// TestIdempotentWorkerCallIsHandedOverAgain: a worker that takes a call of a
// writes tool and dies before answering (its heartbeat is gone). When the
// tool declares metadata.idempotent, the executor hands the call to another
// worker of the queue, with the same run and call ids (the idempotency key),
// and the call ends with its answer, attempt 2; without the declaration it
// ends UNKNOWN, naming the worker, and no other worker sees it.
func TestIdempotentWorkerCallIsHandedOverAgain(t *testing.T) {
	for _, idempotent := range []bool{true, false} {
		t.Run(fmt.Sprintf("idempotent=%t", idempotent), func(t *testing.T) {
			env := eventstest.Start(t)
			schemas := newEventSchemas(t)
			const queue = "payq"
			s := startExecutor(t, env, Config{ID: "exec-gateway"})
			nc := env.Connect(t)

			// Two live workers of the queue; the first to take a call dies.
			beat := func(instance, id string) {
				subj, err := events.WorkerRPCSubject(queue, events.WorkerBeat)
				require.NoError(t, err)
				b, err := json.Marshal(events.WorkerHeartbeat{Instance: instance, ID: id, StartedAt: time.Now().UTC(), TTLMS: 60_000})
				require.NoError(t, err)
				m, err := nc.Request(subj, b, waitLimit)
				require.NoError(t, err)
				var reply events.WorkerReply
				require.NoError(t, json.Unmarshal(m.Data, &reply))
				require.Empty(t, reply.Error)
			}
			beat("w-1", "worker-1")
			beat("w-2", "worker-2")
			var (
				mu    sync.Mutex
				calls []events.WorkerCall
			)
			callSubj, err := events.WorkerCallSubject(queue)
			require.NoError(t, err)
			sub, err := nc.QueueSubscribe(callSubj, events.QueueWorkerCalls, func(m *nats.Msg) {
				var c events.WorkerCall
				if json.Unmarshal(m.Data, &c) != nil {
					return
				}
				mu.Lock()
				calls = append(calls, c)
				n := len(calls)
				mu.Unlock()
				answer := func(r events.WorkerResult) {
					b, _ := json.Marshal(r)
					_ = m.Respond(b)
				}
				if n == 1 {
					answer(events.WorkerResult{Accepted: &events.WorkerAccepted{Instance: "w-1", ID: "worker-1"}})
					ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
					defer cancel()
					_ = registry.Leave(ctx, env.JS, queue, "w-1") // dies holding the call
					return
				}
				answer(events.WorkerResult{Accepted: &events.WorkerAccepted{Instance: "w-2", ID: "worker-2"}})
				answer(events.WorkerResult{Output: json.RawMessage(`{"temp_c":2}`)})
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Unsubscribe() })

			def := httpDef("pay_worker", envelope.SideEffectsWrites, "")
			def.Implementation, def.Queue = toolapi.BuiltinImplementation("pay_worker@1.0.0"), queue
			def.Metadata.Idempotent = idempotent
			_, err = openRegistry(t, env.JS).Register(t.Context(), def)
			require.NoError(t, err)

			const runID = "run-idem-worker"
			w := watchRun(t, env.JS, runID)
			req := callRequest(t, runID, 1, "pay_worker", "1.0.0", `{"city":"c"}`)
			req.Queue = queue
			publishApproved(t, publish.NewPublisher(env.JS), req)
			got := w.envelopeOf(t, schemas, req)

			mu.Lock()
			defer mu.Unlock()
			for _, c := range calls {
				require.Equal(t, runID, c.RunID)
				require.Equal(t, req.CallID, c.CallID, "the same call, so the same idempotency key")
			}
			if idempotent {
				require.Nil(t, got.Error, "%+v", got.Error)
				require.JSONEq(t, `{"temp_c":2}`, string(got.Output))
				require.Equal(t, 2, got.Attempt)
				require.Len(t, calls, 2, "handed over once more")
				require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.writeReplays.WithLabelValues("pay_worker@1.0.0", "retried")))
				return
			}
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeUnknown, got.Error.Code)
			require.Contains(t, got.Error.Message, "outcome unknown: worker worker-1 of queue payq stopped during the call")
			require.Zero(t, got.Attempt)
			require.Len(t, calls, 1, "never handed over again")
		})
	}
}
