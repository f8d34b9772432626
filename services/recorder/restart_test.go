package recorder_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// restartServer stops env's server and starts another on the same address
// and store, as a NATS restart (or a node's return) does; the new one is
// stopped when the test ends. It returns the new server.
func restartServer(t *testing.T, s *server.Server) *server.Server {
	t.Helper()
	addr, dir := s.Addr().String(), filepath.Dir(s.StoreDir())
	embedded.Stop(s)
	s2, err := embedded.Start(embedded.Options{Listen: addr, StoreDir: dir})
	if err != nil {
		t.Fatalf("restart nats: %v", err)
	}
	t.Cleanup(func() { embedded.Stop(s2) })
	return s2
}

// reconnecting is a test connection that outlives a server's restart.
func reconnecting(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishRetrying publishes o until JetStream stores it (a restart in
// between), within ctx.
func publishRetrying(ctx context.Context, pub *publish.Publisher, o events.Outgoing) error {
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := pub.Publish(pctx, o)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestRecorderRecoversFromANATSRestart restarts NATS (same port, same store)
// while a recorder replica holds deliveries it has not acknowledged: its
// node goes down with the server (its database unreachable, it cannot
// write them, and it dies with them in hand). The surviving replica,
// connected as the binary is (service.Connect), records every event, those
// the dead one held included, once their consumers' ack wait has passed:
// DefaultAckWait after the restart, where JetStream's default of 30s took
// the recorder 23-27s.
func TestRecorderRecoversFromANATSRestart(t *testing.T) {
	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	target, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, target.Host)
	replica := func(dbURL string) (*nats.Conn, *recorder.Service) {
		nc, js, err := service.Connect(testCtx(t), env.URL, "recorder", quietLog())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		rec, err := recorder.New(service.Deps{JS: js, Log: quietLog()}, recorder.Config{DatabaseURL: dbURL, Batch: 16})
		if err != nil {
			t.Fatal(err)
		}
		start(t, rec)
		t.Cleanup(func() { _ = rec.Stop(context.Background()) })
		return nc, rec
	}
	doomedConn, doomed := replica(viaProxy(t, dsn, proxy))
	replica(dsn) // the survivor
	testJS := reconnecting(t, env.URL)
	for _, spec := range recorder.ConsumerSpecs() {
		if got := consumerInfo(t, testJS, spec).Config.AckWait; got != recorder.DefaultAckWait {
			t.Fatalf("%s: ack wait %s, want %s", spec.Durable, got, recorder.DefaultAckWait)
		}
	}

	const n = 40
	base := time.Now().Add(-time.Hour)
	total := 0
	runs := make([]*storetest.Run, n)
	for i := range runs {
		runs[i] = storetest.CompletedRun(t, fmt.Sprintf("restart-%03d", i), "weather", storetest.TenantA,
			base.Add(time.Duration(i)*time.Second))
		total += len(runs[i].Events)
	}
	pub := publish.NewPublisher(testJS)
	publishRuns := func(runs []*storetest.Run) {
		t.Helper()
		for _, fx := range runs {
			for _, o := range fx.Events {
				if err := publishRetrying(testCtx(t), pub, o); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	// The doomed replica's database goes away: it holds what it took, and
	// the survivor records the rest.
	proxy.cut()
	publishRuns(runs[:n/2])
	held := 0
	eventually(t, "the doomed replica to hold deliveries and the survivor to take the rest", func() (bool, string) {
		held = 0
		desc := ""
		done := true
		for _, spec := range recorder.ConsumerSpecs()[:2] {
			info := consumerInfo(t, testJS, spec)
			held += info.NumAckPending
			done = done && info.NumPending == 0
			desc += fmt.Sprintf("%s: %d pending, %d unacknowledged; ", spec.Durable, info.NumPending, info.NumAckPending)
		}
		return done && held > 0 && !doomed.DatabaseUp(), desc
	})

	// Its node goes down: NATS with it, and the replica dies with the
	// deliveries in hand (no connection to acknowledge or hand them back).
	doomedConn.Close()
	restartServer(t, env.Server)
	restarted := time.Now()
	stopCtx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	_ = doomed.Stop(stopCtx) // it cannot settle what it held: that is the point
	cancel()
	publishRuns(runs[n/2:])

	var last string
	recorded := func() bool {
		var got int
		if err := pool.QueryRow(testCtx(t), "SELECT count(*) FROM events").Scan(&got); err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%d of %d events recorded", got, total)
		return got == total
	}
	// Far below the 30s JetStream's default ack wait took: what the dead
	// replica held comes back DefaultAckWait (5s) after the restart, and
	// the survivor's reconnection takes about 2s.
	deadline := time.Now().Add(20 * time.Second)
	for !recorded() {
		if time.Now().After(deadline) {
			t.Fatalf("%s after the restart: %s (the dead replica held %d deliveries)",
				time.Since(restarted).Round(time.Millisecond), last, held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("every event (%d) recorded %s after the restart; the dead replica held %d deliveries",
		total, time.Since(restarted).Round(time.Millisecond), held)
	eventually(t, "the consumers to settle", func() (bool, string) {
		desc := ""
		done := true
		for _, spec := range recorder.ConsumerSpecs() {
			info := consumerInfo(t, testJS, spec)
			done = done && info.NumPending == 0 && info.NumAckPending == 0
			desc += fmt.Sprintf("%s: %d pending, %d unacknowledged; ", spec.Durable, info.NumPending, info.NumAckPending)
		}
		return done, desc
	})
}

// TestRecorderSlowDatabaseIsNotRedelivered: a batch that takes three ack
// waits to commit (the events table locked) is kept alive by its runner,
// never redelivered: a short ack wait costs nothing in normal running.
func TestRecorderSlowDatabaseIsNotRedelivered(t *testing.T) {
	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const ackWait = time.Second
	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog()},
		recorder.Config{DatabaseURL: dsn, Batch: 16, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, rec)
	for _, spec := range recorder.ConsumerSpecs() {
		if got := consumerInfo(t, env.JS, spec).Config.AckWait; got != ackWait {
			t.Fatalf("%s: ack wait %s, want %s", spec.Durable, got, ackWait)
		}
	}

	tx, err := pool.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(testCtx(t), "LOCK TABLE events IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	fx := storetest.CompletedRun(t, "slow-db", "weather", storetest.TenantA, time.Now())
	publishEvents(t, env.JS, fx.Events...)
	eventually(t, "the recorder to hold the run's events", func() (bool, string) {
		info := consumerInfo(t, env.JS, recorder.ConsumerSpecs()[0])
		return info.NumAckPending > 0, fmt.Sprintf("%d unacknowledged", info.NumAckPending)
	})
	time.Sleep(3 * ackWait) // the database is slow: three ack waits for one batch
	if err := tx.Commit(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every event to be recorded", func() (bool, string) {
		var got int
		if err := pool.QueryRow(testCtx(t), "SELECT count(*) FROM events").Scan(&got); err != nil {
			return false, err.Error()
		}
		return got == len(fx.Events), fmt.Sprintf("%d of %d", got, len(fx.Events))
	})
	eventually(t, "the consumers to settle", func() (bool, string) {
		desc, done := "", true
		for _, spec := range recorder.ConsumerSpecs() {
			info := consumerInfo(t, env.JS, spec)
			done = done && info.NumPending == 0 && info.NumAckPending == 0
			desc += fmt.Sprintf("%s: %d pending, %d unacknowledged; ", spec.Durable, info.NumPending, info.NumAckPending)
		}
		return done, desc
	})
	for _, spec := range recorder.ConsumerSpecs() {
		if info := consumerInfo(t, env.JS, spec); info.NumRedelivered != 0 || info.Delivered.Consumer != info.Delivered.Stream {
			t.Errorf("%s: %d redelivered, %d deliveries of %d messages", spec.Durable, info.NumRedelivered,
				info.Delivered.Consumer, info.Delivered.Stream)
		}
	}
}
