package sandbox

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
)

// replica is a sandbox service on a connection of its own, so that a test
// can cut it off like a crashed process. It runs jobs in the runtimes that
// work here and, where none does, without isolation (the insecure
// development setting): the crash tests are about delivery, not isolation,
// and run on machines without bubblewrap or runsc too.
type replica struct {
	s       *Service
	nc      *nats.Conn
	stopped bool
}

func startReplica(t *testing.T, env *eventstest.Env, id string, ackWait time.Duration) *replica {
	t.Helper()
	nc := env.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cfg := Config{ID: id, InsecureDev: true, StateDir: t.TempDir(), Concurrency: 2, Cgroups: "off", Limits: testLimits(), AckWait: ackWait}
	s, err := New(service.Deps{
		JS:      js,
		Log:     slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Metrics: prometheus.NewRegistry(),
	}, cfg)
	require.NoError(t, err)
	startCtx, endStart := context.WithTimeout(context.Background(), 2*time.Minute)
	defer endStart()
	require.NoError(t, s.Start(startCtx))
	r := &replica{s: s, nc: nc}
	t.Cleanup(func() {
		if r.stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
	return r
}

// crash cuts the replica off in the middle of its jobs: no ack, no
// extension and no result of theirs reaches NATS any more, as if the
// process had died.
func (r *replica) crash() {
	r.stopped = true
	r.nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = r.s.Stop(ctx) // releases its goroutines and kills its jobs; their outcome is lost
}

// TestJobOfACrashedReplica: a replica dies in the middle of a job, another
// starts, and the job gets its answer while its call still waits: it runs
// again when the time its deadline leaves allows, and is answered TIMEOUT
// when none is left, never dropped. The job is sent as the executor sends a
// call of a tool (services/executor/tools/sandboxtool): its deadline is when
// the call stops waiting, its timeout leaves a margin before it. Before, the
// job came back only after the consumer's ack wait of 30s, past the ~27s a
// call of a tool with the default timeout has, and every job in flight at a
// crash ended TIMEOUT.
func TestJobOfACrashedReplica(t *testing.T) {
	for _, c := range []struct {
		name     string
		callTime time.Duration // the call's time left when it sends the job
		source   string
		want     string // the output; "" for a TIMEOUT
	}{
		// A tool with the default timeout (30s): time enough for a
		// second run after the crash.
		{name: "time left", callTime: 30 * time.Second, source: "import time\ntime.sleep(3)\nprint(42)", want: "42"},
		// A call about to end: its redelivered job finds no time left.
		{name: "no time left", callTime: 4 * time.Second, source: "import time\ntime.sleep(60)\nprint(42)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := eventstest.Start(t)
			a := startReplica(t, env, "sandbox-a", 0)
			cons, err := env.JS.Consumer(t.Context(), events.StreamSandbox, Durable)
			require.NoError(t, err)
			require.Equal(t, DefaultAckWait, cons.CachedInfo().Config.AckWait)

			job := serviceJob("c0a5e1", c.source)
			job.Deadline = time.Now().Add(c.callTime)
			job.TimeoutMS = int((c.callTime - min(max(c.callTime/10, 200*time.Millisecond), 3*time.Second)).Milliseconds())
			publishJob(t, env.JS, job)
			require.Eventually(t, func() bool { return testutil.ToFloat64(a.s.metrics.inFlight) == 1 },
				time.Minute, 10*time.Millisecond, "replica a never took the job")
			a.crash()
			startReplica(t, env, "sandbox-b", 0)

			res, _ := awaitResult(t, env.JS, job.RunID, job.CallID)
			require.NoError(t, res.Validate())
			require.Equal(t, "sandbox-b", res.Worker, "the job is answered by the replica that took it over")
			if c.want != "" {
				require.Nil(t, res.Error, "the job of the crashed replica must run again while its call waits")
				require.JSONEq(t, c.want, string(res.Output))
				return
			}
			require.NotNil(t, res.Error)
			require.Equal(t, envelope.CodeTimeout, res.Error.Code)
			require.Contains(t, res.Error.Message, "waited past its deadline")
		})
	}
}

// TestAnsweredJobIsNotRunAgain: a job stored longer ago than the ack wait
// may have gone to another replica meanwhile even on its first delivery here
// (it waited in this replica's pull buffer, not yet extended, while every
// slot was busy); when its answer is stored already it is acknowledged
// without running it again.
func TestAnsweredJobIsNotRunAgain(t *testing.T) {
	env := eventstest.Start(t)
	job := serviceJob("a05e1d", "print(7)")
	publishJob(t, env.JS, job)
	res := events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Output: []byte(`7`), Worker: "sandbox-other", DurationMS: 1}
	out, err := events.NewSandboxResult("/toolwire/sandbox", res, job.TenantID, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, out)
	time.Sleep(1100 * time.Millisecond) // the job is now older than the ack wait below

	r := startReplica(t, env, "sandbox-late", time.Second)
	eventstest.Drained(t, env.JS, events.StreamSandbox, Durable, time.Minute) // the job acknowledged
	require.Zero(t, testutil.CollectAndCount(r.s.metrics.jobs), "the answered job must not run again")
	got, _ := awaitResult(t, env.JS, job.RunID, job.CallID)
	require.Equal(t, "sandbox-other", got.Worker)
}
