package identity_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

// TestProducerAccount: the producer trusted with every tenant, in its own
// account, may send run requests and intakes and read the runs and calls
// streams and the blobs by direct gets (through events.ImportedJSAPI), and
// receives run and call events live; the server refuses everything else.
func TestProducerAccount(t *testing.T) {
	s, keys := serve(t)
	op := connectAs(t, s, keys, identity.Operator)
	c := connectAs(t, s, keys, identity.Producer)
	api := events.ImportedJSAPI
	const call = "0123456789abcdef"
	cases := []struct{ subject, want string }{
		{"toolwire.run.r1.requested", "allowed"},
		{"toolwire.intake.acme._.r1", "allowed"},
		{"toolwire.intake.globex.eu.r1", "allowed"},
		{api + ".STREAM.INFO." + events.StreamRuns, "allowed"},
		{api + ".STREAM.INFO." + events.StreamCalls, "allowed"},
		{api + ".STREAM.INFO.OBJ_" + provision.ObjectBlobs, "allowed"},
		{api + ".DIRECT.GET." + events.StreamRuns + ".toolwire.run.r1.requested", "allowed"},
		{api + ".DIRECT.GET." + events.StreamCalls, "allowed"},
		// Outside its role: refused by the server.
		{"toolwire.run.r1.completed", "denied"},
		{"toolwire.run.r1.turn.1.completed", "denied"},
		{"toolwire.call.r1." + call + ".completed", "denied"},
		{"toolwire.call.r1." + call + ".decided", "denied"},
		{"toolwire.call.r1." + call + ".approved.default", "denied"},
		{"$KV." + provision.BucketTools + ".echo.1.0.0", "denied"},
		{"$KV." + events.BucketApprovals + ".r1." + call, "denied"},
		{"$JS.API.INFO", "allowed"}, // answered in its own account: JetStream not enabled
		{"$JS.API.STREAM.INFO." + events.StreamRuns, "denied"},
		{api + ".CONSUMER.CREATE." + events.StreamRuns, "denied"},
		{api + ".CONSUMER.CREATE." + events.StreamRuns + ".x.toolwire.run.>", "denied"},
		{api + ".STREAM.INFO.KV_" + provision.BucketSecrets, "denied"},
		{api + ".DIRECT.GET.KV_" + provision.BucketSecrets + ".$KV.toolwire_secrets.x", "denied"},
		{api + ".STREAM.PURGE.OBJ_" + provision.ObjectBlobs, "denied"},
		{"$O." + provision.ObjectBlobs + ".C.x", "denied"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, c.publish(t, tc.subject), "producer publishing %s", tc.subject)
	}
	for _, sub := range []string{">", "toolwire.>", "$KV.>", "_INBOX.>", "_INBOX_executor.>"} {
		require.Equal(t, "denied", c.subscribe(t, op, sub, "toolwire.x"), "producer subscribing %s", sub)
	}
	// The run and call events come to it live, from the system account.
	for _, subj := range []string{"toolwire.run.r1.completed", "toolwire.call.r1." + call + ".completed"} {
		require.Equal(t, "allowed", c.subscribe(t, op, subj, subj), subj)
	}
}

// protected are subjects of the system account's streams, buckets and
// JetStream API that no producer or tenant may write: each is named as the
// reply subject of what JetStream answers.
func protected(call string) []string {
	return []string{
		"toolwire.run.r9.requested",
		"toolwire.run.r9.completed",
		"toolwire.call.r9." + call + ".decided",
		"toolwire.call.r9." + call + ".completed",
		"toolwire.intake.globex._.r9",
		"toolwire.dlq.toolwire.run.r9.requested",
		"$KV." + provision.BucketTools + ".echo.1.0.0",
		"$KV." + events.BucketApprovals + ".r9." + call,
		"$KV." + provision.BucketRunState + ".r9",
		"$KV." + provision.BucketOutcomes + ".r9",
		"$O." + provision.ObjectBlobs + ".M.x",
		"$JS.API.STREAM.DELETE." + events.StreamRuns,
		"$JS.API.STREAM.PURGE." + events.StreamCalls,
		"$JS.API.CONSUMER.DELETE." + events.StreamCalls + ".orchestrator",
	}
}

// TestAnswersStayInTheirAccount: whatever reply subject a producer or a
// tenant names (a stream's subject, a bucket's key, another tenant's intake,
// a JetStream API call), JetStream's answer to its publish, its direct get
// and its batch direct get goes back into its own account: nothing is
// stored in the system account, and no stream, bucket or consumer is
// touched. Its attempts to create a consumer (a push consumer would
// deliver where its config says) get no answer.
func TestAnswersStayInTheirAccount(t *testing.T) {
	dir := t.TempDir()
	keys, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	acme := identity.Tenant{Org: "acme"}
	require.NoError(t, keys.AddTenant(acme))
	s, keys := serveWith(t, keys)
	op := connectAs(t, s, keys, identity.Operator)
	ojs, err := jetstream.New(op.nc)
	require.NoError(t, err)
	ctx := t.Context()
	// Something to read back: a run request and a call's completion.
	const call = "0123456789abcdef"
	_, err = ojs.Publish(ctx, "toolwire.run.r1.requested", []byte(`{"a":1}`))
	require.NoError(t, err)
	_, err = ojs.Publish(ctx, "toolwire.call.r1."+call+".completed", []byte(`{"b":2}`))
	require.NoError(t, err)
	before := counts(t, ojs)

	prod := connectAs(t, s, keys, identity.Producer)
	ten := connectTenant(t, s, keys, acme)
	api := events.ImportedJSAPI
	type vector struct {
		who     *conn
		subject string
		body    string
	}
	vectors := []vector{
		{prod, "toolwire.run.r2.requested", `{}`},
		{prod, "toolwire.intake.acme._.r2", `{}`},
		{prod, api + ".DIRECT.GET." + events.StreamRuns + ".toolwire.run.r1.requested", ``},
		{prod, api + ".DIRECT.GET." + events.StreamCalls, `{"last_by_subj":"toolwire.call.r1.` + call + `.completed"}`},
		{prod, api + ".DIRECT.GET." + events.StreamRuns, `{"seq":1,"next_by_subj":"toolwire.run.>","batch":10}`},
		{prod, api + ".STREAM.MSG.GET." + events.StreamRuns, `{"seq":1}`},
		{prod, api + ".STREAM.INFO." + events.StreamRuns, ``},
		{ten, "toolwire.intake.acme._.r3", `{}`},
	}
	for _, v := range vectors {
		for _, reply := range protected(call) {
			require.NoError(t, v.who.nc.PublishRequest(v.subject, reply, []byte(v.body)), v.subject)
		}
		require.NoError(t, v.who.nc.Flush())
	}
	// A consumer, push or pull, cannot be asked for at all.
	push, err := json.Marshal(map[string]any{"stream_name": events.StreamRuns,
		"config": map[string]any{"deliver_subject": "toolwire.call.r9." + call + ".decided", "ack_policy": "none"}})
	require.NoError(t, err)
	for _, subj := range []string{
		api + ".CONSUMER.CREATE." + events.StreamRuns, "$JS.API.CONSUMER.CREATE." + events.StreamRuns,
		"$JS.API.CONSUMER.CREATE." + events.StreamRuns + ".x.toolwire.run.>",
	} {
		for _, who := range []*conn{prod, ten} {
			_, err := who.nc.Request(subj, push, 500*time.Millisecond)
			require.Error(t, err, subj)
		}
	}
	// The answers were sent: each vector's own answer comes back to it.
	for _, v := range vectors {
		m, err := v.who.nc.Request(v.subject, []byte(v.body), wait)
		require.NoError(t, err, v.subject)
		require.NotEmpty(t, m.Data, v.subject)
	}
	after := counts(t, ojs)
	// What the vectors' own subjects stored (the run requests and intakes
	// they published) is all that changed.
	for name, n := range before {
		if name == events.StreamRuns || name == events.StreamIntake {
			continue
		}
		require.Equal(t, n, after[name], "stream %s", name)
	}
	runs, err := ojs.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	info, err := runs.Info(ctx, jetstream.WithSubjectFilter(events.SubjectsRuns))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"toolwire.run.r1.requested", "toolwire.run.r2.requested"}, mapsKeys(info.State.Subjects),
		"nothing stored under a redirected reply subject")
	intake, err := ojs.Stream(ctx, events.StreamIntake)
	require.NoError(t, err)
	info, err = intake.Info(ctx, jetstream.WithSubjectFilter(events.SubjectsIntake))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"toolwire.intake.acme._.r2", "toolwire.intake.acme._.r3"}, mapsKeys(info.State.Subjects))
	calls, err := ojs.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)
	cons := calls.ListConsumers(ctx)
	for range cons.Info() {
		t.Fatal("a consumer was created")
	}
	require.NoError(t, cons.Err())
}

// counts are the messages in each stream of the system account, and the
// streams it has.
func counts(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	names := js.StreamNames(t.Context())
	for n := range names.Name() {
		st, err := js.Stream(t.Context(), n)
		require.NoError(t, err)
		info, err := st.Info(t.Context())
		require.NoError(t, err)
		out[n] = info.State.Msgs
	}
	require.NoError(t, names.Err())
	require.True(t, slices.Contains(mapsKeys(out), events.StreamRuns))
	return out
}

func mapsKeys(m map[string]uint64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAnswersInTheSystemAccountCanBeRedirected is the control of
// TestAnswersStayInTheirAccount: inside the system account the same vector
// stores JetStream's answer under the reply subject. That is why only
// toolwire's own services and its operators are there (docs/operations.md,
// Accounts).
func TestAnswersInTheSystemAccountCanBeRedirected(t *testing.T) {
	s, keys := serve(t)
	op := connectAs(t, s, keys, identity.Operator)
	const decided = "toolwire.call.r9.0123456789abcdef.decided"
	require.NoError(t, op.nc.PublishRequest("toolwire.run.r5.requested", decided, []byte(`{}`)))
	js, err := jetstream.New(op.nc)
	require.NoError(t, err)
	calls, err := js.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, err := calls.GetLastMsgForSubject(t.Context(), decided)
		require.NoError(c, err)
		require.Contains(c, string(m.Data), events.StreamRuns, "the PubAck, stored as a decision")
	}, wait, 10*time.Millisecond)
}

// connectWorker connects as the worker identity w.
func connectWorker(t *testing.T, s *server.Server, keys *identity.Keys, w identity.Worker) *conn {
	t.Helper()
	opts, err := identity.WorkerConnectOptions(keys.WorkerSeedFile(w))
	require.NoError(t, err)
	return dial(t, s, identity.Role("worker "+w.String()), opts)
}

// TestWorkerAccount: a worker's identity reaches the executors' worker
// requests of its own queues and answers its own queues' calls, nothing
// else: no event, no bucket, no JetStream API, no other queue; and what the
// executor answers it cannot be redirected into a stream.
func TestWorkerAccount(t *testing.T) {
	keys, err := identity.LoadOrCreate(t.TempDir())
	require.NoError(t, err)
	billing, err := identity.ParseWorker("billing")
	require.NoError(t, err)
	reports, err := identity.ParseWorker("reports+exports")
	require.NoError(t, err)
	require.Equal(t, []string{"exports", "reports"}, reports.Queues)
	require.NoError(t, keys.AddWorker(billing))
	require.NoError(t, keys.AddWorker(reports))
	overlap, err := identity.ParseWorker("billing+other")
	require.NoError(t, err)
	require.ErrorIs(t, keys.AddWorker(overlap), identity.ErrWorker, "a queue belongs to one worker identity")
	for _, bad := range []string{"", "default", "a+a", "Upper", "a.b", "a+*"} {
		_, err := identity.ParseWorker(bad)
		require.ErrorIs(t, err, identity.ErrWorker, bad)
	}
	again, err := identity.LoadOrCreate(keys.Dir)
	require.NoError(t, err)
	require.Equal(t, []identity.Worker{billing, reports}, again.Workers())

	s, keys := serveWith(t, keys)
	op := connectAs(t, s, keys, identity.Operator)
	exe := connectAs(t, s, keys, identity.Executor)
	// The executor answers the workers' requests, as services/executor does.
	_, err = exe.nc.QueueSubscribe(events.SubjectsWorkerRPC, events.QueueWorkerRPC, func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) })
	require.NoError(t, err)
	require.NoError(t, exe.nc.Flush())

	c := connectWorker(t, s, keys, billing)
	api := events.ImportedJSAPI
	const call = "0123456789abcdef"
	cases := []struct{ subject, want string }{
		{"toolwire.rpc.worker.billing.register", "allowed"},
		{"toolwire.rpc.worker.billing.beat", "allowed"},
		{"$JS.API.INFO", "allowed"}, // its own account answers: no JetStream
		{"toolwire.rpc.worker.reports.register", "denied"},
		{"toolwire.rpc.worker.default.register", "denied"},
		{"toolwire.call.r1." + call + ".completed", "denied"},
		{"toolwire.call.r1." + call + ".started", "denied"},
		{"toolwire.call.r1." + call + ".decided", "denied"},
		{"toolwire.run.r1.requested", "denied"},
		{"toolwire.intake.acme._.r1", "denied"},
		{"toolwire.worker.billing.call", "denied"},
		{"$KV." + provision.BucketTools + ".echo.1.0.0", "denied"},
		{"$KV." + provision.BucketWorkers + ".billing.x", "denied"},
		{"$JS.API.CONSUMER.MSG.NEXT." + events.StreamCalls + ".executor-billing", "denied"},
		{"$JS.API.CONSUMER.MSG.NEXT." + events.StreamCalls + ".executor", "denied"},
		{"$JS.API.CONSUMER.CREATE." + events.StreamCalls, "denied"},
		{"$JS.API.DIRECT.GET.KV_" + provision.BucketSecrets + ".$KV.toolwire_secrets.x", "denied"},
		{"$JS.API.STREAM.PURGE.OBJ_" + provision.ObjectBlobs, "denied"},
		{"$O." + provision.ObjectBlobs + ".C.x", "denied"},
		{api + ".DIRECT.GET." + events.StreamCalls, "denied"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, c.publish(t, tc.subject), "worker publishing %s", tc.subject)
	}
	for _, sub := range []string{"toolwire.worker.reports.call", "toolwire.worker.*.call", "toolwire.call.>", ">", "_INBOX_executor.>", "$KV.>"} {
		require.Equal(t, "denied", c.subscribe(t, op, sub, "toolwire.x"), "worker subscribing %s", sub)
	}

	// The executor's calls reach the worker of their queue, and its answer
	// comes back; another queue's worker never sees them.
	_, err = c.nc.QueueSubscribe("toolwire.worker.billing.*", events.QueueWorkerCalls, func(m *nats.Msg) { _ = m.Respond([]byte(`{"output":{}}`)) })
	require.NoError(t, err)
	require.NoError(t, c.nc.Flush())
	r := connectWorker(t, s, keys, reports)
	seen := make(chan string, 4)
	_, err = r.nc.Subscribe("toolwire.worker.reports.*", func(m *nats.Msg) { seen <- m.Subject; _ = m.Respond([]byte(`{"output":{}}`)) })
	require.NoError(t, err)
	require.NoError(t, r.nc.Flush())
	m, err := exe.nc.Request("toolwire.worker.billing.call", []byte(`{}`), wait)
	require.NoError(t, err)
	require.JSONEq(t, `{"output":{}}`, string(m.Data))
	_, err = exe.nc.Request("toolwire.worker.reports.call", []byte(`{}`), wait)
	require.NoError(t, err)
	require.Equal(t, "toolwire.worker.reports.call", <-seen)
	_, err = exe.nc.Request("toolwire.worker.nobody.call", []byte(`{}`), time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders, "no worker identity serves that queue")

	// A cancel the executor publishes (no reply) reaches every replica of
	// its queue's worker, outside their queue group, and no other worker
	// account; another queue's worker may not subscribe to it.
	billingCancel, err := events.WorkerCancelSubject("billing")
	require.NoError(t, err)
	for _, sub := range []string{billingCancel, "toolwire.worker.*.cancel", "toolwire.worker.>"} {
		require.Equal(t, "denied", r.subscribe(t, op, sub, billingCancel), "worker reports subscribing %s", sub)
	}
	cancels := make(chan string, 4)
	for range 2 { // two replicas of the billing worker
		replica := connectWorker(t, s, keys, billing)
		_, err = replica.nc.Subscribe(billingCancel, func(m *nats.Msg) { cancels <- string(m.Data) })
		require.NoError(t, err)
		require.NoError(t, replica.nc.Flush())
	}
	require.NoError(t, exe.nc.Publish(billingCancel, []byte(`{"run_id":"r1","call_id":"`+call+`"}`)))
	require.NoError(t, exe.nc.Flush())
	for range 2 {
		select {
		case got := <-cancels:
			require.JSONEq(t, `{"run_id":"r1","call_id":"`+call+`"}`, got)
		case <-time.After(wait):
			t.Fatal("a billing worker replica did not receive its queue's cancel")
		}
	}
	require.NoError(t, r.nc.Flush())
	select {
	case subj := <-seen:
		t.Fatalf("worker reports received %s", subj)
	default:
	}

	// The answers to the worker's requests stay in its account.
	ojs, err := jetstream.New(op.nc)
	require.NoError(t, err)
	before := counts(t, ojs)
	for _, reply := range protected(call) {
		require.NoError(t, c.nc.PublishRequest("toolwire.rpc.worker.billing.beat", reply, []byte(`{}`)))
	}
	require.NoError(t, c.nc.Flush())
	_, err = c.nc.Request("toolwire.rpc.worker.billing.beat", []byte(`{}`), wait)
	require.NoError(t, err)
	require.Equal(t, before, counts(t, ojs), "nothing stored under a redirected reply subject")
}
