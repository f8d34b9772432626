package provision_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/clustertest"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

var allBuckets = []string{provision.BucketRunState, provision.BucketTools, provision.BucketCache,
	provision.BucketRate, provision.BucketSecrets, provision.BucketSecretNames, provision.BucketOutcomes, events.BucketApprovals, provision.BucketWorkers, provision.BucketDLQAudit}

// streamState is what must not change when Provision runs again.
type streamState struct {
	Config  jetstream.StreamConfig
	Created time.Time
	Msgs    uint64
}

func snapshot(ctx context.Context, t testing.TB, js jetstream.JetStream) map[string]streamState {
	t.Helper()
	out := map[string]streamState{}
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		out[info.Config.Name] = streamState{Config: info.Config, Created: info.Created, Msgs: info.State.Msgs}
	}
	require.NoError(t, lister.Err())
	return out
}

func TestProvisionCreatesEverythingAndIsIdempotent(t *testing.T) {
	env := eventstest.Start(t) // provisioned once already
	ctx := testCtx(t)
	env.Publish(t, callStarted(t, 1))
	kv, err := env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	_, err = kv.Put(ctx, runID, []byte(`{"state":"running"}`))
	require.NoError(t, err)

	before := snapshot(ctx, t, env.JS)
	require.NoError(t, provision.Provision(ctx, env.JS, provision.StoreConfig{}))
	require.NoError(t, provision.Provision(ctx, env.JS, provision.StoreConfig{}))
	after := snapshot(ctx, t, env.JS)
	require.Equal(t, before, after, "provisioning again changes nothing")

	// Four event streams, the timers, the intake, nine buckets and two
	// object stores.
	names := make([]string, 0, len(after))
	for n := range after {
		names = append(names, n)
	}
	slices.Sort(names)
	require.Equal(t, []string{
		"KV_" + events.BucketApprovals, "KV_" + provision.BucketCache, "KV_" + provision.BucketDLQAudit, "KV_" + provision.BucketOutcomes, "KV_" + provision.BucketRate,
		"KV_" + provision.BucketRunState, "KV_" + provision.BucketSecretNames, "KV_" + provision.BucketSecrets, "KV_" + provision.BucketTools, "KV_" + provision.BucketWorkers,
		"OBJ_" + provision.ObjectBlobs, "OBJ_" + provision.ObjectDeadLetters,
		events.StreamCalls, events.StreamDLQ, events.StreamIntake, events.StreamRuns, events.StreamSandbox, provision.StreamTimers,
	}, names)

	wantSubjects := map[string]string{
		events.StreamRuns: "toolwire.run.>", events.StreamCalls: "toolwire.call.>",
		events.StreamSandbox: "toolwire.sandbox.>", events.StreamDLQ: "toolwire.dlq.>",
	}
	for name, subj := range wantSubjects {
		cfg := after[name].Config
		require.Equal(t, []string{subj}, cfg.Subjects, name)
		require.Equal(t, jetstream.FileStorage, cfg.Storage, name)
		require.Equal(t, jetstream.LimitsPolicy, cfg.Retention, name)
		require.Equal(t, 7*24*time.Hour, cfg.MaxAge, name)
		require.Equal(t, 10*time.Minute, cfg.Duplicates, name)
		require.Equal(t, 1, cfg.Replicas, name)
	}
	require.EqualValues(t, 1, after[events.StreamCalls].Msgs, "the event published before is kept")

	for _, b := range allBuckets {
		_, err := env.JS.KeyValue(ctx, b)
		require.NoError(t, err, b)
	}
	e, err := kv.Get(ctx, runID)
	require.NoError(t, err)
	require.JSONEq(t, `{"state":"running"}`, string(e.Value()), "KV contents survive")
	tools, err := env.JS.KeyValue(ctx, provision.BucketTools)
	require.NoError(t, err)
	st, err := tools.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, jetstream.KeyValueMaxHistory, st.History(), "each version keeps its last 64 changes")
	cache, err := env.JS.KeyValue(ctx, provision.BucketCache)
	require.NoError(t, err)
	cst, err := cache.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Minute, cst.LimitMarkerTTL(), "per-key TTL is enabled on the cache")

	obj, err := env.JS.ObjectStore(ctx, provision.ObjectBlobs)
	require.NoError(t, err)
	_, err = obj.PutBytes(ctx, "blob-1", []byte("big output"))
	require.NoError(t, err)
	require.NoError(t, provision.Provision(ctx, env.JS, provision.StoreConfig{}))
	b, err := obj.GetBytes(ctx, "blob-1")
	require.NoError(t, err)
	require.Equal(t, "big output", string(b))
}

func TestProvisionWithCustomConfig(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	// A retention shorter than the one in place is refused, naming every
	// store and setting, and changes nothing.
	before := snapshot(ctx, t, env.JS)
	err := provision.Provision(ctx, env.JS, provision.StoreConfig{MaxAge: time.Minute, MaxBytes: 1 << 30})
	require.ErrorIs(t, err, provision.ErrWouldLower)
	var lowered *provision.LoweringError
	require.ErrorAs(t, err, &lowered)
	require.Equal(t, []string{"max age 168h0m0s -> 1m0s", "max bytes none -> 1073741824"}, lowered.Stores[events.StreamRuns])
	require.Equal(t, []string{"max age 168h0m0s -> 1m0s"}, lowered.Stores["KV_"+provision.BucketRunState])
	require.NotContains(t, lowered.Stores, "KV_"+provision.BucketTools, "a bucket without a TTL keeps none")
	require.ErrorContains(t, err, "toolwire provision --lower")
	require.Equal(t, before, snapshot(ctx, t, env.JS), "nothing changed")

	// On purpose, it goes through. A short retention: the default duplicate
	// window shrinks to fit it.
	cfg := provision.StoreConfig{MaxAge: time.Minute, Lower: true}
	require.NoError(t, provision.Provision(ctx, env.JS, cfg))
	s, err := env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Minute, info.Config.MaxAge)
	require.Equal(t, time.Minute, info.Config.Duplicates)

	require.NoError(t, provision.Provision(ctx, env.JS, provision.StoreConfig{MaxAge: time.Hour, Duplicates: 2 * time.Minute}))
	info, err = s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Hour, info.Config.MaxAge)
	require.Equal(t, 2*time.Minute, info.Config.Duplicates)

	err = provision.Provision(ctx, env.JS, provision.StoreConfig{Replicas: 9})
	require.ErrorContains(t, err, "replicas 9: must be between 1 and 5")
}

func TestStoreConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  provision.StoreConfig
		msg  string // "" means valid
	}{
		{"zero value", provision.StoreConfig{}, ""},
		{"cluster", provision.StoreConfig{Replicas: 3}, ""},
		{"five replicas", provision.StoreConfig{Replicas: 5}, ""},
		{"negative replicas", provision.StoreConfig{Replicas: -1}, "replicas -1"},
		{"six replicas", provision.StoreConfig{Replicas: 6}, "replicas 6: must be between 1 and 5"},
		{"short max age", provision.StoreConfig{MaxAge: time.Minute}, ""},
		{"window equal to max age", provision.StoreConfig{MaxAge: time.Hour, Duplicates: time.Hour}, ""},
		{"window over max age", provision.StoreConfig{MaxAge: time.Minute, Duplicates: 2 * time.Minute}, "duplicate window 2m0s must not exceed max age 1m0s"},
		{"window over default max age", provision.StoreConfig{Duplicates: 8 * 24 * time.Hour}, "must not exceed max age"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.msg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestStoreConfigs(t *testing.T) {
	mem := provision.StoreConfig{Memory: true, Replicas: 3}
	for _, sc := range mem.StreamConfigs() {
		require.Equal(t, jetstream.MemoryStorage, sc.Storage, sc.Name)
		require.Equal(t, 3, sc.Replicas, sc.Name)
	}
	kvs := mem.KVConfigs()
	require.Len(t, kvs, len(allBuckets))
	for i, kc := range kvs {
		require.Equal(t, allBuckets[i], kc.Bucket)
		require.Equal(t, jetstream.MemoryStorage, kc.Storage)
		require.Equal(t, 3, kc.Replicas)
	}
}

func TestCheckServerVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"2.11.0": true, "2.11.4": true, "2.12.0-RC.1": true, "v2.15.2": true, "3.0.0": true,
		"2.10.22": false, "2.9.25": false, "1.4.1": false, "": false, "garbage": false, "2": false,
	} {
		err := provision.CheckServerVersion(v)
		if ok {
			require.NoError(t, err, v)
			continue
		}
		require.ErrorIs(t, err, provision.ErrServerTooOld, v)
		require.ErrorContains(t, err, "2.11.0 or newer", v)
	}
}

// ProvisionRetrying gives up when its context ends, saying how often it
// tried and why it failed; a failure for good (a lowering) is not retried.
func TestProvisionRetryingGivesUp(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true}) // no JetStream
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	tries := 0
	err = provision.ProvisionRetrying(ctx, js, provision.StoreConfig{}, func(int, error) { tries++ })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "gave up after")
	require.GreaterOrEqual(t, tries, 2)

	env := eventstest.Start(t)
	tries = 0
	err = provision.ProvisionRetrying(t.Context(), env.JS, provision.StoreConfig{MaxAge: time.Hour}, func(int, error) { tries++ })
	require.ErrorIs(t, err, provision.ErrWouldLower)
	require.Zero(t, tries, "a lowering is not retried")
}

// TestProvisionOnAForming3NodeCluster: provisioning on the first node of a
// cluster still forming is retried until the cluster has its quorum, then
// creates every stream with three replicas; starting a service with fewer
// replicas than that is refused with the message, and changes nothing.
func TestProvisionOnAForming3NodeCluster(t *testing.T) {
	c := clustertest.New(t, "provision-test")
	c.StartNode(0)
	nc, err := nats.Connect(c.URL(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx := testCtx(t)
	var retries atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- provision.ProvisionRetrying(ctx, js, provision.StoreConfig{Replicas: 3}, func(int, error) { retries.Add(1) })
	}()
	require.Eventually(t, func() bool { return retries.Load() >= 1 }, 30*time.Second, 10*time.Millisecond,
		"the lone node cannot place three replicas yet")
	c.StartNode(1)
	c.StartNode(2)
	require.NoError(t, <-done)

	before := snapshot(ctx, t, js)
	for name, st := range before {
		require.Equal(t, 3, st.Config.Replicas, name)
	}
	err = provision.Provision(ctx, js, provision.StoreConfig{Replicas: 1})
	require.ErrorIs(t, err, provision.ErrWouldLower)
	var lowered *provision.LoweringError
	require.ErrorAs(t, err, &lowered)
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores[events.StreamRuns])
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores["KV_"+provision.BucketRunState])
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores["OBJ_"+provision.ObjectBlobs])
	require.Len(t, lowered.Stores, len(before), "every store named")
	require.Equal(t, before, snapshot(ctx, t, js), "nothing changed")
	require.NoError(t, provision.Provision(ctx, js, provision.StoreConfig{Replicas: 3}), "the same settings again are fine")
}
