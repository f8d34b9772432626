package executor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// appendLog is the external state of the writes tool: a file that every run
// of the tool appends one line "<run_id> <call_id>" to, synced to disk.
type appendLog struct {
	path    string
	mu      sync.Mutex
	entered chan entered // one per run of the tool, after its line is written
}

type entered struct{ replica, callID string }

// appender is one replica's instance of the writes tool append_line. Input
// {"hold": true} keeps it running (after its write) until its context ends:
// a call caught in the middle.
type appender struct {
	replica string
	log     *appendLog
}

func (appender) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "append_line", Version: "1.0.0", Description: "appends a line to a file",
		InputSchema:  json.RawMessage(`{"type":"object","properties":{"hold":{"type":"boolean"},"n":{"type":"integer"}}}`),
		OutputSchema: json.RawMessage(`{"type":"object","required":["ok"]}`),
		Metadata:     envelope.ToolMetadata{Category: envelope.CategoryData, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		TimeoutMS:    60_000, Implementation: toolapi.BuiltinImplementation("test_append_line"),
	}
}

func (a appender) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	var in struct {
		Hold bool `json:"hold"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	a.log.mu.Lock()
	f, err := os.OpenFile(a.log.path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err == nil {
		_, err = f.WriteString(tc.RunID + " " + tc.CallID + "\n")
		err = errorsJoin(err, f.Sync(), f.Close())
	}
	a.log.mu.Unlock()
	if err != nil {
		return nil, err
	}
	a.log.entered <- entered{replica: a.replica, callID: tc.CallID}
	if in.Hold {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	return json.RawMessage(`{"ok":true}`), nil
}

func errorsJoin(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// lines counts the lines of the append log.
func (l *appendLog) lines(t testing.TB) map[string]int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.Open(l.path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out[sc.Text()]++
	}
	require.NoError(t, sc.Err())
	return out
}

// replica is an executor on a connection of its own, so that a test can cut
// it off like a crashed process.
type replica struct {
	id      string
	s       *Service
	nc      *nats.Conn
	stopped bool
}

func startReplica(t *testing.T, env *eventstest.Env, id string, cfg Config, log *appendLog) *replica {
	t.Helper()
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	d := testDeps(t, env, nil)
	d.JS = js
	cfg.ID = id
	s := newExecutor(t, d, cfg, WithTools(appender{replica: id, log: log}))
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

// crash cuts the replica off: no heartbeat, no record, no ack reaches NATS
// any more, as if the process had died in the middle of its calls.
func (r *replica) crash() {
	r.stopped = true
	r.nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = r.s.Stop(ctx) // releases goroutines; its calls are already lost
}

// interrupt stops the replica with a drain deadline shorter than its calls:
// they are cancelled in the middle.
func (r *replica) interrupt() {
	r.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = r.s.Stop(ctx)
}

// publishCopies publishes n more copies of the approved call, without their
// Nats-Msg-Id: JetStream stores each, as it would after the duplicate window,
// and the shared consumer delivers them to any replica.
func publishCopies(t testing.TB, js jetstream.JetStream, req events.CallRequest, n int) {
	t.Helper()
	out := approved(t, req, events.RunTrace{})
	for range n {
		m, err := events.Encode(out.Subject, &out.Event)
		require.NoError(t, err)
		m.Header.Del(events.HeaderMsgID)
		_, err = js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
}

// waitIdle waits until the shared consumer has delivered and seen
// acknowledged every message.
func waitIdle(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	eventstest.Drained(t, js, events.StreamCalls, Durable, waitLimit)
}

func waitEntered(t testing.TB, log *appendLog) entered {
	t.Helper()
	select {
	case e := <-log.entered:
		return e
	case <-time.After(waitLimit):
		t.Fatal("the tool never ran")
	}
	return entered{}
}

// TestExactlyOnceWrites: a writes tool runs at most once per call whatever
// happens: its replica crashes in the middle of calls (their redeliveries
// yield UNKNOWN "outcome unknown" envelopes), a replica is stopped in the
// middle of a call, replicas are restarted, and every call is delivered many
// times (copies of the message) across three replicas at once. Every call's
// line is in the file exactly once, and every call has one envelope.
func TestExactlyOnceWrites(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	log := &appendLog{path: filepath.Join(t.TempDir(), "effects.log"), entered: make(chan entered, 1024)}
	cfg := Config{Concurrency: 4, AckWait: time.Second, ClaimLease: 600 * time.Millisecond}
	const runID = "run-exactly-once"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	var reqs []events.CallRequest
	newCall := func(hold bool) events.CallRequest {
		req := callRequest(t, runID, len(reqs)+1, "append_line", "1.0.0", fmt.Sprintf(`{"hold":%t,"n":%d}`, hold, len(reqs)))
		reqs = append(reqs, req)
		return req
	}

	// 1. Replica a takes three calls and crashes in the middle of them.
	a := startReplica(t, env, "eo-a", cfg, log)
	var held []events.CallRequest
	for range 3 {
		req := newCall(true)
		held = append(held, req)
		publishApproved(t, pub, req)
	}
	for range held {
		require.Equal(t, "eo-a", waitEntered(t, log).replica)
	}
	a.crash()

	// 2. Three replicas (a restarted, b, c) share the rest: the crashed calls
	// are redelivered after the ack wait; 20 more calls arrive five times
	// each; the crashed calls arrive three more times each.
	replicas := map[string]*replica{}
	for _, id := range []string{"eo-a2", "eo-b", "eo-c"} {
		replicas[id] = startReplica(t, env, id, cfg, log)
	}
	var normal []events.CallRequest
	for range 20 {
		req := newCall(false)
		normal = append(normal, req)
		publishApproved(t, pub, req)
		publishCopies(t, env.JS, req, 4)
	}
	for _, req := range held {
		publishCopies(t, env.JS, req, 3)
	}
	for _, req := range held {
		got := w.envelopeOf(t, schemas, req)
		require.NotNil(t, got.Error, "a crashed call has no result")
		require.Equal(t, envelope.CodeUnknown, got.Error.Code)
		require.Equal(t, MsgOutcomeUnknown, got.Error.Message)
		require.Empty(t, got.Output)
	}
	for _, req := range normal {
		got := w.envelopeOf(t, schemas, req)
		require.Nil(t, got.Error, "%+v", got.Error)
		require.JSONEq(t, `{"ok":true}`, string(got.Output))
	}
	for range normal {
		waitEntered(t, log)
	}

	// 3. A replica stopped in the middle of a call records that call's
	// outcome as unknown itself; a restarted replica takes its place.
	mid := newCall(true)
	publishApproved(t, pub, mid)
	holder := waitEntered(t, log).replica
	replicas[holder].interrupt()
	replicas[holder+"-restarted"] = startReplica(t, env, holder+"-restarted", cfg, log)
	got := w.envelopeOf(t, schemas, mid)
	require.NotNil(t, got.Error)
	require.Equal(t, envelope.CodeUnknown, got.Error.Code)
	require.Equal(t, MsgOutcomeUnknown, got.Error.Message)

	// 4. Every call delivered three more times, after everything settled.
	waitIdle(t, env.JS)
	for _, req := range reqs {
		publishCopies(t, env.JS, req, 3)
	}
	waitIdle(t, env.JS)

	// Every call's effect is in the file exactly once.
	lines := log.lines(t)
	require.Len(t, lines, len(reqs))
	for _, req := range reqs {
		require.Equal(t, 1, lines[runID+" "+req.CallID], "call %d ran %d times", req.Seq, lines[runID+" "+req.CallID])
		require.Equal(t, uint64(1), count(t, env.JS, completedSubject(t, req)), "one envelope per call")
	}
	select {
	case e := <-log.entered:
		t.Fatalf("call %s ran again on %s", e.callID, e.replica)
	default:
	}
	var recorded, unknown float64
	for _, r := range replicas {
		recorded += testutil.ToFloat64(r.s.metrics.writeReplays.WithLabelValues("append_line@1.0.0", "recorded"))
		unknown += testutil.ToFloat64(r.s.metrics.writeReplays.WithLabelValues("append_line@1.0.0", "unknown"))
	}
	t.Logf("redeliveries answered from the record: %v, declared unknown: %v", recorded, unknown)
	require.GreaterOrEqual(t, recorded, float64(3*len(reqs)), "each of the last copies at least")
	require.Equal(t, 3.0, unknown, "the three crashed calls")

	// The outcome records hold the final envelopes.
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), outcomeKey(runID, held[0].CallID))
	require.NoError(t, err)
	var rec outcomeRecord
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	require.Equal(t, outcomeDone, rec.State)
	require.True(t, strings.HasPrefix(rec.Owner, "eo-a/"), "claimed by the crashed replica: %s", rec.Owner)
	require.Equal(t, MsgOutcomeUnknown, rec.Envelope.Error.Message)
}

// TestClaimHeartbeatKeepsALongCallAlive: a writes call that runs for several
// leases keeps its claim with heartbeats; a copy delivered meanwhile to
// another replica waits for its outcome instead of declaring it unknown or
// running it again.
func TestClaimHeartbeatKeepsALongCallAlive(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	log := &appendLog{path: filepath.Join(t.TempDir(), "effects.log"), entered: make(chan entered, 16)}
	cfg := Config{Concurrency: 2, AckWait: time.Second, ClaimLease: 300 * time.Millisecond}
	// hb-a has one slot, taken by the long call: the copies go to hb-b.
	first := startReplica(t, env, "hb-a", Config{Concurrency: 1, AckWait: cfg.AckWait, ClaimLease: cfg.ClaimLease}, log)
	const runID = "run-heartbeat"
	w := watchRun(t, env.JS, runID)
	req := callRequest(t, runID, 1, "append_line", "1.0.0", `{"hold":true}`)
	publishApproved(t, publish.NewPublisher(env.JS), req)
	require.Equal(t, "hb-a", waitEntered(t, log).replica)

	second := startReplica(t, env, "hb-b", cfg, log)
	publishCopies(t, env.JS, req, 2)
	// Five leases: long enough for a copy to find the claim on hb-b.
	hold := time.NewTimer(5 * cfg.ClaimLease)
	select {
	case <-hold.C:
	case <-t.Context().Done():
		t.Fatal("test ended")
	}
	first.interrupt() // ends the held call: its outcome is recorded by hb-a
	got := w.envelopeOf(t, schemas, req)
	require.Equal(t, MsgOutcomeUnknown, got.Error.Message)
	waitIdle(t, env.JS)
	require.Equal(t, map[string]int{runID + " " + req.CallID: 1}, log.lines(t))
	require.Equal(t, 0.0, testutil.ToFloat64(second.s.metrics.writeReplays.WithLabelValues("append_line@1.0.0", "unknown")),
		"the live claim was never declared unknown by the other replica")
	require.GreaterOrEqual(t, testutil.ToFloat64(second.s.metrics.writeReplays.WithLabelValues("append_line@1.0.0", "recorded")), 1.0)
}

func testOutcomes(t *testing.T, owner string) *outcomes {
	t.Helper()
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
	require.NoError(t, err)
	return &outcomes{kv: kv, owner: owner, lease: 300 * time.Millisecond, now: time.Now,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), life: t.Context()}
}

// A writes call this process finished but could not record is recorded
// with its real outcome when the call comes again here, not declared
// unknown; another process's stale claim still is.
func TestUnrecordedOutcomeIsRecordedOnRetry(t *testing.T) {
	o := testOutcomes(t, "exec-1/aa")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	at := time.Now().UTC()
	_, _, err := o.claim(ctx, "run1.c1", at)
	require.NoError(t, err)
	done := envelope.ToolEnvelope{CallID: "c1", Name: "ledger_write", Version: "1.0.0", Output: json.RawMessage(`{"ok":true}`), TStart: at, TEnd: at}
	o.keepUnrecorded("run1.c1", done) // finish failed: the bucket did not answer

	unknown := func(rec outcomeRecord) envelope.ToolEnvelope { return unknownOutcome(done, rec, time.Now()) }
	env, recorded, found, err := o.resolve(ctx, "run1.c1", unknown)
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, recorded, "the real outcome, not unknown")
	require.Nil(t, env.Error)
	require.JSONEq(t, `{"ok":true}`, string(env.Output))
	rec, _, _, err := o.get(ctx, "run1.c1")
	require.NoError(t, err)
	require.Equal(t, outcomeDone, rec.State)

	// Another process's claim whose heartbeat stopped: unknown, as before.
	other := &outcomes{kv: o.kv, owner: "exec-2/bb", lease: o.lease, now: o.now, log: o.log, life: o.life}
	_, _, err = other.claim(ctx, "run1.c2", at)
	require.NoError(t, err)
	env, recorded, found, err = o.resolve(ctx, "run1.c2", unknown)
	require.NoError(t, err)
	require.True(t, found)
	require.False(t, recorded)
	require.Equal(t, envelope.CodeUnknown, env.Error.Code)
}

// The unrecorded outcomes, and the claims sent unanswered, are bounded.
func TestUnrecordedOutcomesAreBounded(t *testing.T) {
	var o outcomes
	for i := range maxUnrecorded + 10 {
		o.keepUnrecorded(string(rune('a'+i%26))+time.Duration(i).String(), envelope.ToolEnvelope{})
	}
	require.Len(t, o.unrecorded, maxUnrecorded)
	_, ok := o.takeUnrecorded("nope")
	require.False(t, ok)
	for i := range maxUnrecorded + 10 {
		o.keepUnconfirmed(time.Duration(i).String(), time.Now())
	}
	require.Len(t, o.unconfirmed, maxUnrecorded, "so are the claims sent unanswered")
}

// lostAnswerKV stores a Create and then answers it with an error, as a
// connection cut after the write does.
type lostAnswerKV struct {
	jetstream.KeyValue
	lose bool
}

func (kv *lostAnswerKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, value, opts...)
	if err == nil && kv.lose {
		kv.lose = false
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

// A claim stored whose answer was lost is this process's: its retry takes it
// over and runs the call, instead of waiting a lease for a heartbeat that
// never comes and declaring the call unknown. Another process's claim, and a
// claim of this process's that it did not send unanswered, are still taken.
func TestClaimWhoseAnswerWasLostIsTakenOver(t *testing.T) {
	o := testOutcomes(t, "exec-1/aa")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv := &lostAnswerKV{KeyValue: o.kv, lose: true}
	o.kv = kv

	first := time.Now().UTC()
	_, _, err := o.claim(ctx, "run1.c1", first)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the claim is stored, its answer lost")
	rec, _, found, err := o.get(ctx, "run1.c1")
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, rec.ClaimedAt.Equal(first))

	// The retry's look at the record does not wait for a heartbeat.
	unknown := func(rec outcomeRecord) envelope.ToolEnvelope {
		return unknownOutcome(envelope.ToolEnvelope{}, rec, time.Now())
	}
	start := time.Now()
	_, _, found, err = o.resolve(ctx, "run1.c1", unknown)
	require.NoError(t, err)
	require.False(t, found, "its own unanswered claim: claimed again")
	require.Less(t, time.Since(start), o.lease, "not waited on")

	again := first.Add(time.Millisecond)
	rev, got, err := o.claim(ctx, "run1.c1", again)
	require.NoError(t, err, "taken over")
	require.True(t, got.ClaimedAt.Equal(again))
	rec, e, _, err := o.get(ctx, "run1.c1")
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision())
	require.True(t, rec.ClaimedAt.Equal(again))
	_, _, err = o.claim(ctx, "run1.c1", again.Add(time.Millisecond))
	require.ErrorIs(t, err, errClaimTaken, "a confirmed claim is not taken over, even by its own process")

	// Another process's claim, with this one's lost answer for another
	// claim time: taken, and left to its heartbeat.
	other := &outcomes{kv: o.kv.(*lostAnswerKV).KeyValue, owner: "exec-2/bb", lease: o.lease, now: o.now, log: o.log, life: o.life}
	_, _, err = other.claim(ctx, "run1.c2", first)
	require.NoError(t, err)
	o.keepUnconfirmed("run1.c2", first)
	_, _, err = o.claim(ctx, "run1.c2", again)
	require.ErrorIs(t, err, errClaimTaken)
	rec, _, _, err = o.get(ctx, "run1.c2")
	require.NoError(t, err)
	require.Equal(t, "exec-2/bb", rec.Owner)
}
