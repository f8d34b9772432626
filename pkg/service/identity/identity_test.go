package identity_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve starts an embedded server that knows only the roles' users, and
// provisions toolwire's streams and buckets as the operator.
func serve(t *testing.T) (*server.Server, *identity.Keys) {
	t.Helper()
	keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
	require.NoError(t, err)
	return serveWith(t, keys)
}

// serveWith is serve with these keys.
func serveWith(t *testing.T, keys *identity.Keys) (*server.Server, *identity.Keys) {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	op := connectAs(t, s, keys, identity.Operator)
	js, err := jetstream.New(op.nc)
	require.NoError(t, err)
	require.NoError(t, provision.Provision(t.Context(), js, provision.StoreConfig{Replicas: 1}))
	return s, keys
}

// conn is a client of one role that sees the server's asynchronous errors.
type conn struct {
	role identity.Role
	nc   *nats.Conn
	errs chan error
}

func connectAs(t *testing.T, s *server.Server, keys *identity.Keys, r identity.Role) *conn {
	t.Helper()
	opts, err := identity.ConnectOptions(r, keys.SeedFile(r))
	require.NoError(t, err)
	return dial(t, s, r, opts)
}

// dial connects with opts; who names the client in messages.
func dial(t *testing.T, s *server.Server, who identity.Role, opts []nats.Option) *conn {
	t.Helper()
	c := &conn{role: who, errs: make(chan error, 16)}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { c.errs <- err }))
	var err error
	c.nc, err = nats.Connect(s.ClientURL(), opts...)
	require.NoError(t, err, who)
	t.Cleanup(c.nc.Close)
	return c
}

const wait = 5 * time.Second

// outcome is what the server did with one attempt: "allowed" (an answer
// came) or "denied" (the server's permissions violation came).
func (c *conn) outcome(t *testing.T, got <-chan *nats.Msg, subject string) string {
	t.Helper()
	select {
	case m := <-got:
		if m.Header.Get("Status") == "503" {
			return "unreached" // no responders: nothing in the client's account answers
		}
		return "allowed"
	case err := <-c.errs:
		require.ErrorIs(t, err, nats.ErrPermissionViolation, "%s on %s", c.role, subject)
		require.Contains(t, err.Error(), subject)
		return "denied"
	case <-time.After(wait):
		t.Fatalf("%s on %s: neither an answer nor a refusal within %s", c.role, subject, wait)
		return ""
	}
}

// publish publishes a request on subject: a stream's subject answers with
// its PubAck, a JetStream API subject with its reply.
func (c *conn) publish(t *testing.T, subject string) string {
	t.Helper()
	inbox := c.nc.NewRespInbox()
	got := make(chan *nats.Msg, 1)
	sub, err := c.nc.ChanSubscribe(inbox, got)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, c.nc.PublishRequest(subject, inbox, []byte(`{}`)))
	return c.outcome(t, got, subject)
}

// subscribe subscribes on subject; the operator then publishes on probe,
// which subject matches.
func (c *conn) subscribe(t *testing.T, op *conn, subject, probe string) string {
	t.Helper()
	got := make(chan *nats.Msg, 1)
	sub, err := c.nc.ChanSubscribe(subject, got)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, c.nc.Flush())
	require.NoError(t, op.nc.Publish(probe, []byte("probe")))
	// Until the server has the probe: a refused subscription answers at
	// once, and a probe still in the operator's buffer would otherwise
	// reach a subscriber made after this check (TestWorkerAccount's
	// replicas once got "probe" for their cancel).
	require.NoError(t, op.nc.Flush())
	return c.outcome(t, got, subject)
}

// TestPermissionMatrix: for every role, each publish and subscribe below is
// allowed exactly for the roles listed, and refused by the server for every
// other. The lists are written out here, not read from the role table, so
// that a change of the table that opens a door fails this test.
func TestPermissionMatrix(t *testing.T) {
	s, keys := serve(t)
	op := connectAs(t, s, keys, identity.Operator)
	const call = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const (
		orch = identity.Orchestrator
		pol  = identity.Policy
		exe  = identity.Executor
		sbx  = identity.Sandbox
		rec  = identity.Recorder
		ops  = identity.Operations
	)
	pubs := []struct {
		subject string
		allowed []identity.Role // besides the operator
	}{
		// The events: who may announce what.
		{"toolwire.run.r1.requested", []identity.Role{orch, rec}},
		{"toolwire.intake.acme._.r1", nil},
		{"toolwire.run.r1.cancel_requested", []identity.Role{orch, rec}},
		{"toolwire.run.r1.cancelled", []identity.Role{orch, ops}},
		{"toolwire.run.r1.turn.1.completed", []identity.Role{orch, ops}},
		{"toolwire.run.r1.started", []identity.Role{orch, ops}},
		{"toolwire.run.r1.completed", []identity.Role{orch, ops}},
		{"toolwire.run.r1.failed", []identity.Role{orch, ops}},
		{"toolwire.call.r1." + call + ".approved.default", []identity.Role{pol}},
		{"toolwire.call.r1." + call + ".approval_required", []identity.Role{pol, ops}},
		{"toolwire.call.r1." + call + ".decided", []identity.Role{rec}},
		{"toolwire.call.r1." + call + ".started", []identity.Role{exe, ops}},
		{"toolwire.call.r1." + call + ".completed", []identity.Role{orch, pol, exe, ops}},
		{"toolwire.sandbox.r1." + call + ".requested", []identity.Role{exe}},
		{"toolwire.sandbox.r1." + call + ".completed", []identity.Role{sbx, ops}},
		{"toolwire.dlq.toolwire.run.r1.requested", []identity.Role{orch, pol, exe, sbx, rec}},
		// State: each bucket's writers.
		{"$KV." + provision.BucketRunState + ".r1", []identity.Role{orch}},
		{"$KV." + events.BucketApprovals + ".r1." + call, []identity.Role{pol}},
		{"$KV." + provision.BucketSecrets + ".t1.token", nil},
		{"$KV." + provision.BucketTools + ".echo.1", []identity.Role{exe, sbx, rec}},
		{"$KV." + provision.BucketOutcomes + ".x", []identity.Role{exe}},
		{"$KV." + provision.BucketWorkers + ".default.x", []identity.Role{exe}},
		{"$JS.API.DIRECT.GET.KV_" + provision.BucketWorkers + ".x", []identity.Role{pol, exe, rec}},
		// JetStream's API: reading, consuming, and what only operators do.
		{"$JS.API.INFO", []identity.Role{orch, pol, exe, sbx, rec, ops}},
		{"$JS.API.STREAM.INFO." + events.StreamCalls, []identity.Role{orch, pol, exe, sbx, rec}},
		{"$JS.API.CONSUMER.DURABLE.CREATE." + events.StreamCalls + ".x", []identity.Role{orch, pol, exe, rec}},
		{"$JS.API.CONSUMER.DURABLE.CREATE." + events.StreamIntake + ".x", []identity.Role{orch}},
		{"$JS.API.CONSUMER.CREATE." + events.StreamSandbox + ".x", []identity.Role{exe, sbx, rec}},
		{"$JS.API.DIRECT.GET.KV_" + provision.BucketSecrets + ".x", []identity.Role{exe}},
		{"$JS.API.STREAM.PURGE." + events.StreamDLQ, nil},
		{"$JS.API.STREAM.DELETE.none", nil},
		{"$JS.API.STREAM.CREATE.other", nil},
		{"$JS.API.STREAM.CREATE." + events.StreamRuns, []identity.Role{orch, pol, exe, sbx, rec}},
		{"$JS.API.STREAM.UPDATE." + events.StreamRuns, nil},
		{"$JS.API.STREAM.UPDATE.KV_" + provision.BucketRunState, nil},
		{"$JS.API.CONSUMER.DELETE." + events.StreamCalls + ".orchestrator", nil},
		{"$JS.API.CONSUMER.DELETE." + events.StreamSandbox + ".x", []identity.Role{exe}},
		{"$JS.API.CONSUMER.DELETE." + events.StreamSandbox + "." + identity.SandboxDurable, nil},
		{"$JS.API.CONSUMER.DELETE.KV_" + provision.BucketTools + ".x", []identity.Role{orch, pol, exe, sbx, rec}},
		// The sealed secrets are read by the executor alone; their names
		// by the recorder's catalog.
		{"$JS.API.CONSUMER.CREATE.KV_" + provision.BucketSecrets + ".x", []identity.Role{exe}},
		{"$JS.API.CONSUMER.CREATE.KV_" + provision.BucketSecretNames + ".x", []identity.Role{rec}},
		{"$JS.API.CONSUMER.CREATE.KV_" + provision.BucketWorkers + ".x", []identity.Role{pol, exe, rec}},
		// The rate buckets: taken from by the executor, read by the catalog.
		{"$JS.API.DIRECT.GET.KV_" + provision.BucketRate + ".x", []identity.Role{exe, rec}},
		// The dead letters: the operations role reads them, deletes one
		// once replayed, keeps the replay audit; nobody purges them.
		{"$JS.API.CONSUMER.CREATE." + events.StreamDLQ + ".x", []identity.Role{rec, ops}},
		{"$JS.API.DIRECT.GET." + events.StreamDLQ, []identity.Role{rec, ops}},
		{"$JS.API.STREAM.MSG.DELETE." + events.StreamDLQ, []identity.Role{ops}},
		{"$JS.API.STREAM.MSG.DELETE." + events.StreamCalls, nil},
		{"$JS.API.CONSUMER.DELETE." + events.StreamDLQ + ".x", []identity.Role{ops}},
		{"$KV." + provision.BucketDLQAudit + ".x", []identity.Role{ops}},
		{"$JS.API.CONSUMER.CREATE.OBJ_" + provision.ObjectDeadLetters + ".x", []identity.Role{orch, pol, exe, sbx, rec, ops}},
		{"$JS.API.CONSUMER.CREATE.KV_" + provision.BucketDLQAudit + ".x", []identity.Role{ops}},
		// The model's deltas: the orchestrator's alone (core NATS).
		{"toolwire.delta.r1.1", []identity.Role{orch}},
		{"toolwire.rpc.worker.q.register", nil},
		{"elsewhere.anything", nil},
	}
	subs := []struct {
		subject, probe string
		allowed        []identity.Role
	}{
		{"toolwire.>", "toolwire.x", nil},
		// The recorder follows the runs its API's clients wait on, live.
		{"toolwire.run.r1.requested", "toolwire.run.r1.requested", []identity.Role{rec}},
		{"toolwire.call.r1.>", "toolwire.call.r1." + call + ".completed", []identity.Role{rec}},
		{"toolwire.sandbox.r1.>", "toolwire.sandbox.r1." + call + ".completed", []identity.Role{rec}},
		{"toolwire.delta.r1.*", "toolwire.delta.r1.1", []identity.Role{rec}},
		{events.SubjectPreview, events.SubjectPreview, []identity.Role{exe}},
		{events.SubjectsWorkerRPC, "toolwire.rpc.worker.q.beat", []identity.Role{exe}},
		{"toolwire.worker.q.call", "toolwire.worker.q.call", nil},
		{"toolwire.run.*.cancel_requested", "toolwire.run.r1.cancel_requested", []identity.Role{orch, exe, sbx, rec}},
		{"_INBOX.>", "_INBOX.x", nil},
		{">", "anything", nil},
		{"_INBOX_executor.>", "_INBOX_executor.x", []identity.Role{exe}},
		{"_INBOX_producer.>", "_INBOX_producer.x", nil},
	}
	// A core NATS subject no stream holds answers a publish through a
	// responder of the operator's.
	echo, err := op.nc.Subscribe("toolwire.delta.r1.1", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = echo.Unsubscribe() })
	require.NoError(t, op.nc.Flush())
	for _, r := range identity.Roles() {
		if r == identity.Operator || r == identity.Producer {
			continue // the producer is in an account of its own: TestProducerAccount
		}
		t.Run(string(r), func(t *testing.T) {
			c := connectAs(t, s, keys, r)
			for _, p := range pubs {
				want := "denied"
				if slices.Contains(p.allowed, r) {
					want = "allowed"
				}
				require.Equal(t, want, c.publish(t, p.subject), "%s publishing %s", r, p.subject)
			}
			for _, sb := range subs {
				want := "denied"
				if slices.Contains(sb.allowed, r) {
					want = "allowed"
				}
				require.Equal(t, want, c.subscribe(t, op, sb.subject, sb.probe), "%s subscribing %s", r, sb.subject)
			}
			// Its own inbox, where its replies come.
			require.Equal(t, "allowed", c.subscribe(t, op, r.InboxPrefix()+".>", r.InboxPrefix()+".x"))
		})
	}
	t.Run("operator", func(t *testing.T) {
		for _, p := range pubs {
			if strings.Contains(p.subject, "DELETE") || p.subject == "elsewhere.anything" ||
				strings.HasPrefix(p.subject, "$JS.API.STREAM.CREATE") || strings.HasPrefix(p.subject, "$JS.API.STREAM.UPDATE") {
				continue // allowed, and it would change the server under the other subtests
			}
			require.NotEqual(t, "denied", op.publish(t, p.subject), p.subject) // unreached: nothing answers there
		}
	})
}

// TestForgedEventsFromAProducer: an upstream producer's credentials cannot
// announce a call's completion or an approval decision; the JetStream
// publish gets no acknowledgement, and the stream never holds the forgery.
func TestForgedEventsFromAProducer(t *testing.T) {
	s, keys := serve(t)
	c := connectAs(t, s, keys, identity.Producer)
	js, err := jetstream.New(c.nc)
	require.NoError(t, err)
	const call = "ab"
	for _, subject := range []string{"toolwire.call.r1." + call + ".completed", "toolwire.call.r1." + call + ".decided"} {
		ctx, cancel := contextWithTimeout(t, 2*time.Second)
		_, err := js.Publish(ctx, subject, []byte(`{}`))
		cancel()
		require.Error(t, err, subject)
		select {
		case err := <-c.errs:
			require.ErrorIs(t, err, nats.ErrPermissionViolation)
			require.Contains(t, err.Error(), subject)
		case <-time.After(wait):
			t.Fatalf("no refusal of %s", subject)
		}
	}
	op := connectAs(t, s, keys, identity.Operator)
	ojs, err := jetstream.New(op.nc)
	require.NoError(t, err)
	calls, err := ojs.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	_, err = calls.GetLastMsgForSubject(t.Context(), "toolwire.call.>")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing forged was stored")

	// Its own run request is taken.
	ctx, cancel := contextWithTimeout(t, wait)
	defer cancel()
	_, err = js.Publish(ctx, "toolwire.run.r1.requested", []byte(`{}`))
	require.NoError(t, err)
}

// connectTenant connects as the producer limited to tenant.
func connectTenant(t *testing.T, s *server.Server, keys *identity.Keys, tenant identity.Tenant) *conn {
	t.Helper()
	opts, err := identity.TenantConnectOptions(keys.TenantSeedFile(tenant))
	require.NoError(t, err)
	return dial(t, s, identity.Role("tenant "+tenant.String()), opts)
}

// TestTenantProducers: a producer limited to one org hands in run requests
// on that org's intake subjects only, one limited to a workspace on that
// workspace's only; neither may publish a run request directly, forge any
// other event, read a stream, or receive another user's replies.
func TestTenantProducers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	keys, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	acme, globex := identity.Tenant{Org: "acme"}, identity.Tenant{Org: "globex", Workspace: "ws1"}
	require.NoError(t, keys.AddTenant(acme))
	require.NoError(t, keys.AddTenant(globex))
	fi, err := os.Stat(filepath.Join(dir, "tenant.globex.ws1.nk"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NotEqual(t, keys.TenantPublic(acme), keys.TenantPublic(globex))
	// A folder's tenants are read back with its roles.
	again, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	require.Equal(t, []identity.Tenant{acme, globex}, again.Tenants())
	require.Equal(t, keys.TenantPublic(acme), again.TenantPublic(acme))

	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	op := connectAs(t, s, keys, identity.Operator)
	ojs, err := jetstream.New(op.nc)
	require.NoError(t, err)
	require.NoError(t, provision.Provision(t.Context(), ojs, provision.StoreConfig{Replicas: 1}))

	const call = "0123456789abcdef"
	cases := []struct {
		tenant  identity.Tenant
		allowed []string
	}{
		{acme, []string{"toolwire.intake.acme._.r1", "toolwire.intake.acme.ws9.r1", "$JS.API.INFO"}},
		{globex, []string{"toolwire.intake.globex.ws1.r1", "$JS.API.INFO"}},
	}
	denied := []string{
		"toolwire.intake.acme._.r1", "toolwire.intake.acme.ws9.r1", "toolwire.intake.globex.ws1.r1",
		"toolwire.intake.globex.ws2.r1", "toolwire.intake.globex._.r1", "toolwire.intake.other._.r1",
		"toolwire.run.r1.requested", "toolwire.run.r1.completed",
		"toolwire.call.r1." + call + ".completed", "toolwire.call.r1." + call + ".decided",
		"$JS.API.INFO", // answered in its own account: JetStream not enabled
		"$JS.API.STREAM.INFO." + events.StreamRuns, "$JS.API.STREAM.INFO." + events.StreamIntake,
		"$JS.API.CONSUMER.CREATE." + events.StreamRuns, "$JS.API.CONSUMER.CREATE." + events.StreamIntake + ".x",
		"$JS.API.DIRECT.GET." + events.StreamRuns + ".toolwire.run.r1.requested",
		"$JS.API.STREAM.MSG.GET." + events.StreamCalls, "$KV." + provision.BucketRunState + ".r1",
	}
	for _, tc := range cases {
		t.Run(tc.tenant.String(), func(t *testing.T) {
			c := connectTenant(t, s, keys, tc.tenant)
			for _, subj := range denied {
				want := "denied"
				if slices.Contains(tc.allowed, subj) {
					want = "allowed"
				}
				require.Equal(t, want, c.publish(t, subj), "%s publishing %s", tc.tenant, subj)
			}
			other := acme
			if tc.tenant == acme {
				other = globex
			}
			for _, sub := range []string{"toolwire.>", "_INBOX_producer.>", "_INBOX.>",
				identity.TenantInboxPrefix(keys.TenantPublic(other)) + ".>"} {
				require.Equal(t, "denied", c.subscribe(t, op, sub, strings.TrimSuffix(sub, ">")+"x"), "%s subscribing %s", tc.tenant, sub)
			}
			// Its own inbox it may subscribe to (its answers above came there);
			// the operator's probe is in another account and never reaches it.
			own := identity.TenantInboxPrefix(keys.TenantPublic(tc.tenant))
			_, err := c.nc.SubscribeSync(own + ".>")
			require.NoError(t, err)
			require.NoError(t, c.nc.Flush())
			select {
			case err := <-c.errs:
				t.Fatalf("%s: own inbox refused: %v", tc.tenant, err)
			default:
			}
		})
	}
	// Nothing the tenants were refused was stored.
	runs, err := ojs.Stream(t.Context(), events.StreamRuns)
	require.NoError(t, err)
	_, err = runs.GetLastMsgForSubject(t.Context(), "toolwire.run.>")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	intake, err := ojs.Stream(t.Context(), events.StreamIntake)
	require.NoError(t, err)
	info, err := intake.Info(t.Context(), jetstream.WithSubjectFilter(events.SubjectsIntake))
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{"toolwire.intake.acme._.r1": 1, "toolwire.intake.acme.ws9.r1": 1,
		"toolwire.intake.globex.ws1.r1": 1}, info.State.Subjects)

	// Tenants that cannot be named in a subject are refused up front.
	for _, bad := range []string{"", "a.b", "acme/_", "acme/w.s", "a b", "*", "acme/ws/x"} {
		_, err := identity.ParseTenant(bad)
		require.ErrorIs(t, err, identity.ErrTenant, bad)
	}
	got, err := identity.ParseTenant(" globex/ws1 ")
	require.NoError(t, err)
	require.Equal(t, globex, got)
	require.ErrorIs(t, keys.AddTenant(identity.Tenant{Org: "a.b"}), identity.ErrTenant)
	// A stray tenant seed file whose name names no tenant is refused.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tenant.a.b.c.nk"), nil, 0o600))
	_, err = identity.LoadOrCreate(dir)
	require.ErrorIs(t, err, identity.ErrTenant)
}

func contextWithTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}

func TestNoAnonymousClients(t *testing.T) {
	s, _ := serve(t)
	_, err := nats.Connect(s.ClientURL())
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// A key the server does not know is refused too.
	dir := t.TempDir()
	other, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	opts, err := identity.ConnectOptions(identity.Operator, other.SeedFile(identity.Operator))
	require.NoError(t, err)
	_, err = nats.Connect(s.ClientURL(), opts...)
	require.ErrorIs(t, err, nats.ErrAuthorization)
}

func TestSeedFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	keys, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	seen := map[string]bool{}
	for _, r := range identity.Roles() {
		fi, err := os.Stat(keys.SeedFile(r))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), r)
		pub := keys.Public(r)
		require.True(t, nkeys.IsValidPublicUserKey(pub), r)
		require.False(t, seen[pub], "every role has its own key")
		seen[pub] = true
	}
	again, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	require.Equal(t, keys.Public(identity.Executor), again.Public(identity.Executor), "kept, not replaced")

	accountSeed := func(path string) {
		kp, err := nkeys.CreateAccount()
		require.NoError(t, err)
		seed, err := kp.Seed()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, seed, 0o600))
	}
	cases := []struct {
		name  string
		setup func(path string)
		want  string
	}{
		{"readable by others", func(p string) { require.NoError(t, os.Chmod(p, 0o644)) }, "mode 0644, readable by others: chmod 0600"},
		{"group readable", func(p string) { require.NoError(t, os.Chmod(p, 0o640)) }, "readable by others"},
		{"not a seed", func(p string) { require.NoError(t, os.WriteFile(p, []byte("hello"), 0o600)) }, "unusable nkey seed"},
		{"an account seed", accountSeed, "holds no user seed"},
		{"empty", func(p string) { require.NoError(t, os.WriteFile(p, nil, 0o600)) }, "unusable nkey seed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := identity.LoadOrCreate(dir)
			require.NoError(t, err)
			path := identity.SeedFile(dir, identity.Policy)
			tc.setup(path)
			_, err = identity.LoadOrCreate(dir)
			require.ErrorIs(t, err, identity.ErrSeedFile)
			require.ErrorContains(t, err, tc.want)
			_, err = identity.ConnectOptions(identity.Policy, path)
			require.ErrorIs(t, err, identity.ErrSeedFile)
		})
	}
	_, err = identity.ConnectOptions(identity.Policy, filepath.Join(t.TempDir(), "missing.nk"))
	require.True(t, errors.Is(err, os.ErrNotExist), "%v", err)
}

func TestParse(t *testing.T) {
	for _, r := range identity.Roles() {
		got, err := identity.Parse(string(r))
		require.NoError(t, err)
		require.Equal(t, r, got)
		require.NotEmpty(t, r.Doc(), r)
	}
	for _, bad := range []string{"", "admin", "Executor", "executor.x", "worker"} {
		_, err := identity.Parse(bad)
		require.ErrorIs(t, err, identity.ErrUnknownRole, bad)
		require.ErrorContains(t, err, fmt.Sprintf("%q", bad))
	}
	for name, want := range map[string]identity.Role{"orchestrator": identity.Orchestrator, "executor": identity.Executor, "recorder": identity.Recorder} {
		got, ok := identity.ForService(name)
		require.True(t, ok, name)
		require.Equal(t, want, got)
	}
	for _, name := range []string{"operator", "producer", "cli", "", "worker"} {
		_, ok := identity.ForService(name)
		require.False(t, ok, name)
	}
}

// TestServerConfig: the configuration printed for a production server, as
// nats-server itself parses it, has every user in its account with its
// permissions, and JetStream in the system account only.
func TestServerConfig(t *testing.T) {
	keys, err := identity.LoadOrCreate(t.TempDir())
	require.NoError(t, err)
	tenant := identity.Tenant{Org: "acme", Workspace: "ws1"}
	require.NoError(t, keys.AddTenant(tenant))
	var o server.Options
	require.NoError(t, o.ProcessConfigString(keys.ServerConfig()+"\njetstream {}\n"))
	accs := keys.Accounts()
	require.Len(t, accs, 3, "the system account, the producer's and the tenant's")
	byKey := map[string]*server.NkeyUser{}
	for _, u := range o.Nkeys {
		byKey[u.Nkey] = u
	}
	users := 0
	for _, a := range accs {
		for _, u := range a.Users {
			users++
			got := byKey[u.PublicKey]
			require.NotNil(t, got, u.Doc)
			require.Equal(t, a.Name, got.Account.Name, u.Doc)
			require.Equal(t, u.Permissions.Publish, got.Permissions.Publish.Allow, u.Doc)
			require.Equal(t, u.Permissions.PublishDeny, got.Permissions.Publish.Deny, u.Doc)
			require.Equal(t, u.Permissions.Subscribe, got.Permissions.Subscribe.Allow, u.Doc)
			require.Equal(t, u.Permissions.Responses, got.Permissions.Response != nil, u.Doc)
		}
	}
	require.Equal(t, len(identity.Roles())+1, users, "the roles and the tenant")
	require.Len(t, o.Nkeys, users)
	require.Equal(t, identity.ProducerAccount, byKey[keys.Public(identity.Producer)].Account.Name)
	require.Equal(t, identity.TenantAccount(tenant), byKey[keys.TenantPublic(tenant)].Account.Name)
	require.Equal(t, identity.SystemAccount, byKey[keys.Public(identity.Executor)].Account.Name)
}
