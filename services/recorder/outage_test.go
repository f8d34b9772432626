package recorder_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// tcpProxy stands between the recorder and Postgres: cut makes Postgres
// unreachable (open connections are closed, new ones refused), restore
// brings it back.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	up    bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, up: true, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if !up {
			_ = c.Close() // Postgres is "down": connection refused, as it were
			continue
		}
		var d net.Dialer
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := d.DialContext(ctx, "tcp", p.target)
		cancel()
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, s) {
			continue
		}
		p.wg.Go(func() { p.pipe(c, s) })
		p.wg.Go(func() { p.pipe(s, c) })
	}
}

func (p *tcpProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *tcpProxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut closes every open connection and refuses new ones.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = false
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *tcpProxy) restore() {
	p.mu.Lock()
	p.up = true
	p.mu.Unlock()
}

// viaProxy points a Postgres URL at the proxy.
func viaProxy(t *testing.T, dsn string, p *tcpProxy) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestRecorderPostgresOutage makes Postgres unreachable in the middle of a
// burst of runs. The recorder notices, holds what it has and stops pulling
// (its consumers' deliveries stop growing, nothing is redelivered or
// dead-lettered); when Postgres is back it catches up, and every run, every
// event and every envelope is in the database exactly once.
func TestRecorderPostgresOutage(t *testing.T) {
	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	pool, err := pgxpool.New(testCtx(t), dsn) // the test's own view, not through the proxy
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	target, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, target.Host)

	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog()},
		recorder.Config{DatabaseURL: viaProxy(t, dsn, proxy), Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, rec)
	api := httptest.NewServer(rec.Handler())
	t.Cleanup(api.Close)
	h := &harness{t: t, env: env, dsn: dsn, pool: pool, pub: publish.NewPublisher(env.JS), rec: rec, api: api}

	const before, during = 8, 32
	base := time.Now().Add(-time.Hour)
	var runs []*storetest.Run
	for i := range before + during {
		runs = append(runs, storetest.CompletedRun(t, fmt.Sprintf("outage-%02d", i), "weather", storetest.TenantA,
			base.Add(time.Duration(i)*time.Second)))
	}
	for _, fx := range runs[:before] {
		h.publish(fx.Events...)
	}
	h.waitIdle()

	// Postgres goes away; a burst of runs arrives meanwhile.
	proxy.cut()
	var wg sync.WaitGroup
	for _, fx := range runs[before:] {
		wg.Go(func() {
			for _, o := range fx.Events {
				if err := h.pub.Publish(testCtx(t), o); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	eventually(t, "the recorder to notice the outage", func() (bool, string) {
		return !rec.DatabaseUp(), "database still up"
	})

	// It stops pulling: its deliveries stop growing while most of the burst
	// waits in the streams, and nothing is redelivered.
	var last []uint64
	stable := 0
	eventually(t, "the consumers to stop pulling", func() (bool, string) {
		var cur []uint64
		desc := ""
		for _, spec := range recorder.ConsumerSpecs()[:2] {
			info := consumerInfo(t, env.JS, spec)
			cur = append(cur, info.Delivered.Consumer)
			desc += fmt.Sprintf("%s: delivered %d, pending %d, unacknowledged %d, redelivered %d; ", spec.Durable,
				info.Delivered.Consumer, info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		if reflect.DeepEqual(cur, last) {
			stable++
		} else {
			stable = 0
		}
		last = cur
		return stable >= 10, desc
	})
	total := 0
	for _, fx := range runs {
		total += len(fx.Events)
	}
	var pending uint64
	for _, spec := range recorder.ConsumerSpecs()[:2] {
		info := consumerInfo(t, env.JS, spec)
		pending += info.NumPending
		if info.NumRedelivered != 0 {
			t.Errorf("%s redelivered %d messages during the outage", spec.Durable, info.NumRedelivered)
		}
		if info.NumAckPending > 2*16+1 {
			t.Errorf("%s holds %d unacknowledged messages: more than its handlers and pull buffer", spec.Durable, info.NumAckPending)
		}
	}
	if pending == 0 {
		t.Fatalf("every message of the burst was pulled during the outage; want the consumers paused")
	}
	t.Logf("during the outage: %d of %d events wait in the streams", pending, total)

	// Postgres comes back: the recorder catches up.
	proxy.restore()
	h.waitIdle()
	eventually(t, "the recorder to see the database again", func() (bool, string) {
		return rec.DatabaseUp(), "database down"
	})
	h.noDeadLetters()

	want := map[string]int{"events": total, "runs": len(runs), "tool_calls": 2 * len(runs),
		"model_turns": 2 * len(runs), "verdicts": 2 * len(runs)}
	if got := h.counts(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rows = %v, want %v", got, want)
	}
	var dupes int
	if err := pool.QueryRow(testCtx(t), `SELECT count(*) FROM (SELECT envelope->>'call_id' FROM tool_calls
		GROUP BY run_id, envelope->>'call_id' HAVING count(*) > 1) d`).Scan(&dupes); err != nil || dupes != 0 {
		t.Fatalf("duplicated envelopes: %d (%v)", dupes, err)
	}
	for _, fx := range runs {
		status, body := h.get("/v1/runs/" + fx.RunID + "/envelopes")
		wantEnvs := mustMarshal(t, map[string]any{"run_id": fx.RunID, "envelopes": fx.Envelopes})
		if status != http.StatusOK || !jsonEq(body, wantEnvs) {
			t.Fatalf("envelopes of %s: %d %s", fx.RunID, status, body)
		}
		checkRunJSON(t, h.getRun(fx.RunID), fx)
	}
}

func consumerInfo(t *testing.T, js jetstream.JetStream, spec provision.ConsumerSpec) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(testCtx(t), spec.Stream, spec.Durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestRecorderStopsDuringAnOutage: a recorder stopped while it holds events
// for an unreachable database stops promptly; the events it held are
// redelivered to the next recorder, which records them once the database is
// back.
func TestRecorderStopsDuringAnOutage(t *testing.T) {
	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	target, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, target.Host)
	newRec := func() *recorder.Service {
		rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog()},
			recorder.Config{DatabaseURL: viaProxy(t, dsn, proxy), Batch: 8})
		if err != nil {
			t.Fatal(err)
		}
		start(t, rec)
		return rec
	}
	rec := newRec()
	fx := storetest.CompletedRun(t, "stop-outage", "weather", storetest.TenantA, time.Now())
	proxy.cut()
	publishEvents(t, env.JS, fx.Events...)
	eventually(t, "the recorder to notice the outage", func() (bool, string) { return !rec.DatabaseUp(), "up" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rec.Stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stop during an outage: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("stop during an outage took the whole deadline")
	}

	proxy.restore()
	rec = newRec()
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	api := httptest.NewServer(rec.Handler())
	t.Cleanup(api.Close)
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &harness{t: t, env: env, dsn: dsn, pool: pool, pub: publish.NewPublisher(env.JS), rec: rec, api: api}
	h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitIdle()
	h.noDeadLetters()
	checkRunJSON(t, h.getRun(fx.RunID), fx)
}
