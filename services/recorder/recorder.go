// Package recorder is toolwire's recorder service: it consumes every run and
// tool call event, keeps each one in Postgres (or, embedded, in SQLite),
// materializes runs, tool calls, model turns, verdicts and the tool
// definitions of replay bundles from them, and serves them over a read-only
// HTTP API, with a live event stream and the timeline page.
//
// Delivery is at least once and the two streams have no order between them,
// so recording is idempotent and order-independent: an event is keyed by its
// id, and the materialized rows converge whatever order the events arrive in
// (see Store). A message is acknowledged only after the transaction holding
// its effects has committed; an event that cannot be decoded is dead-lettered.
// While the database is unreachable the recorder holds what it has and stops
// pulling; it catches up when the database is back (see batchWriter).
package recorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
)

// The recorder's durable consumers: one per stream, every event of each.
const (
	DurableRuns    = "recorder-runs"
	DurableCalls   = "recorder-calls"
	DurableSandbox = "recorder-sandbox"
)

// maxConcurrency bounds the handlers of one consumer in one replica.
const maxConcurrency = 512

// ConsumerSpecs returns the recorder's consumers.
func ConsumerSpecs() []events.ConsumerSpec {
	return []events.ConsumerSpec{
		{Stream: events.StreamRuns, Durable: DurableRuns, Filters: []string{events.SubjectsRuns}},
		{Stream: events.StreamCalls, Durable: DurableCalls, Filters: []string{events.SubjectsCalls}},
		{Stream: events.StreamSandbox, Durable: DurableSandbox, Filters: []string{events.SubjectsSandbox}},
	}
}

// ErrStopped is returned by Start after Stop: a stopped recorder cannot
// restart.
var ErrStopped = errors.New("recorder: stopped")

type lifecycle int

const (
	idle lifecycle = iota
	running
	stopped
)

// Recorder is the recorder service. It is stateless between events: any
// number of replicas share its two durable consumers and its database.
type Recorder struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	db      *backend
	writer  *batchWriter
	api     http.Handler
	changes *Changes
	metrics *recorderMetrics

	mu      sync.Mutex
	state   lifecycle
	runners []*events.Runner
	tools   toolResolver
	done    chan struct{} // closed by Stop: ends the live streams
}

// New returns a recorder on d's JetStream and the database of cfg. It does no
// I/O: Start connects, migrates and starts consuming.
func New(d service.Deps, cfg Config) (*Recorder, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.JS == nil {
		return nil, errors.New("recorder: Deps.JS is required")
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	db, err := openBackend(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	m, err := newRecorderMetrics(d.Metrics)
	if err != nil {
		db.close()
		return nil, err
	}
	r := &Recorder{cfg: cfg, js: d.JS, log: log, db: db, changes: NewChanges(), metrics: m, done: make(chan struct{})}
	r.writer = newBatchWriter(db.store, cfg.Batch, log)
	r.writer.ping = db.ping
	r.writer.onCommit = func(recs []Record) {
		m.recorded.Add(float64(len(recs)))
		r.changes.notify(recs)
	}
	r.writer.onState = func(up bool) {
		if up {
			m.dbUp.Set(1)
			return
		}
		m.dbUp.Set(0)
		m.outages.Inc()
	}
	r.api = NewServer(db.store, ServerOptions{Log: log, Changes: r.changes, JS: d.JS, Done: r.done, AdminToken: adminToken(d.Getenv)})
	return r, nil
}

type recorderMetrics struct {
	recorded prometheus.Counter
	dbUp     prometheus.Gauge
	outages  prometheus.Counter
}

func newRecorderMetrics(reg prometheus.Registerer) (*recorderMetrics, error) {
	m := &recorderMetrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "toolwire_recorder_events_recorded_total",
			Help: "Events committed to the database (a redelivered event counts again; it changes nothing)."}),
		dbUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "toolwire_recorder_database_up",
			Help: "1 while the database answers, 0 while the recorder holds events for it."}),
		outages: prometheus.NewCounter(prometheus.CounterOpts{Name: "toolwire_recorder_database_outages_total",
			Help: "Times the database became unreachable."}),
	}
	m.dbUp.Set(1)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.recorded, m.dbUp, m.outages} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("recorder metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Build is the service.Build of the recorder binary: configuration from the
// environment, then New. The handler it returns is the HTTP API.
func Build(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
	getenv := d.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration: %w", err)
	}
	r, err := New(d, cfg) //nolint:contextcheck // New does no I/O: the pool connects on first use, in Start
	if err != nil {
		return nil, nil, err
	}
	return r, r.Handler(), nil
}

// Handler returns the HTTP API (see NewAPI).
func (r *Recorder) Handler() http.Handler { return r.api }

// Store returns the recorder's store.
func (r *Recorder) Store() Store { return r.db.store }

// Changes returns the hub that signals each commit's runs.
func (r *Recorder) Changes() *Changes { return r.changes }

// DatabaseUp reports whether the database answered the last write: false while
// the recorder holds events for it.
func (r *Recorder) DatabaseUp() bool { return !r.writer.holding() }

// Start waits for the database (until ctx ends), migrates its schema and
// starts consuming. Starting a running recorder does nothing.
func (r *Recorder) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.state {
	case running:
		return nil
	case stopped:
		return ErrStopped
	}
	if err := r.waitForDatabase(ctx); err != nil {
		return err
	}
	res, err := r.db.migrate(ctx, r.log)
	if err != nil {
		return err
	}
	r.log.Info("schema ready", "store", r.db.kind, "at", r.db.where, "version", res.Version, "applied", res.Applied)
	if tools, err := newRegistryResolver(ctx, r.js, r.log); err != nil {
		r.log.Warn("no tool registry: replay bundles will lack tool definitions", "err", err)
	} else {
		r.tools = tools
	}

	r.writer.start(ctx)
	for _, spec := range ConsumerSpecs() {
		rc := events.RunnerConfig{
			Spec:        spec,
			Handler:     r.handle,
			Concurrency: min(r.cfg.Batch, maxConcurrency),
			Logger:      r.log,
			Poll:        max(r.cfg.Poll, 0),
		}
		if rc.Poll > 0 {
			// Each fetch is decoded on one goroutine and written as one
			// batch: the recorder never has hundreds of handlers runnable at
			// once beside the services on the same CPUs.
			rc.Batch = r.handleBatch
		}
		runner, err := events.NewRunner(r.js, rc)
		if err == nil {
			err = runner.Start(ctx)
		}
		if err != nil {
			serr := r.stopConsuming(context.WithoutCancel(ctx))
			return errors.Join(fmt.Errorf("recorder: consumer %s: %w", spec.Durable, err), serr)
		}
		r.runners = append(r.runners, runner)
	}
	r.state = running
	return nil
}

// Stop drains the consumers (handlers in flight finish, their batches commit
// and they are acknowledged), then stops the writer and closes the database
// pool. It is idempotent; ctx bounds the wait.
func (r *Recorder) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == stopped {
		return nil
	}
	r.state = stopped
	close(r.done)
	err := r.stopConsuming(ctx)
	if r.tools != nil {
		r.tools.stop()
		r.tools = nil
	}
	r.db.close()
	return err
}

func (r *Recorder) stopConsuming(ctx context.Context) error {
	var errs []error
	if r.writer.holding() {
		// The database is down: the handlers in flight wait for it and the
		// drain below would wait for them. Stop the writer first: they fail,
		// and their messages are redelivered to the next recorder.
		if err := r.writer.stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("recorder: stop writer: %w", err))
		}
	}
	for _, runner := range r.runners {
		errs = append(errs, runner.Stop(ctx))
	}
	r.runners = nil
	if err := r.writer.stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("recorder: stop writer: %w", err))
	}
	return errors.Join(errs...)
}

func (r *Recorder) waitForDatabase(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		err := r.db.ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("recorder: %s unreachable: %w", r.db.kind, err)
		}
		r.log.Warn("waiting for the database", "store", r.db.kind, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("recorder: %s unreachable: %w", r.db.kind, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// handle records one event. An event that cannot be decoded, or whose data
// the database refuses, is dead-lettered at once (Permanent); any other
// failure is retried.
func (r *Recorder) handle(ctx context.Context, d *events.Delivery) error {
	rec, err := r.recordOf(ctx, d)
	if err != nil {
		return err
	}
	return writeOutcome(r.writer.write(ctx, rec))
}

// handleBatch records a fetch's events: each decoded as handle does, all
// handed to the writer at once; errs[i] is what handle would return for
// ds[i].
func (r *Recorder) handleBatch(ctx context.Context, ds []*events.Delivery) []error {
	errs := make([]error, len(ds))
	recs := make([]Record, 0, len(ds))
	idx := make([]int, 0, len(ds))
	for i, d := range ds {
		rec, err := r.recordOf(ctx, d)
		if err != nil {
			errs[i] = err
			continue
		}
		recs = append(recs, rec)
		idx = append(idx, i)
	}
	for j, err := range r.writer.writeAll(ctx, recs) {
		errs[idx[j]] = writeOutcome(err)
	}
	return errs
}

// recordOf is the record of one delivery, with its stream position and, for
// a model turn, the definitions of the tools it offered.
func (r *Recorder) recordOf(ctx context.Context, d *events.Delivery) (Record, error) {
	rec, err := RecordOf(d.Event, d.Subject) //nolint:contextcheck // RecordOf does no I/O; it only parses
	if err != nil {
		return Record{}, events.Permanent(err)
	}
	switch {
	case d.Meta != nil:
		rec.Event.Stream, rec.Event.StreamSeq = d.Meta.Stream, d.Meta.Sequence.Stream
	case d.Msg != nil:
		if meta, err := d.Msg.Metadata(); err == nil {
			rec.Event.Stream, rec.Event.StreamSeq = meta.Stream, meta.Sequence.Stream
		}
	}
	if rec.Turn != nil && r.tools != nil {
		rec.Tools = turnTools(ctx, r.tools, rec.Turn)
	}
	return rec, nil
}

// writeOutcome is a handler's error for a write's: a record the store
// refuses is dead-lettered, anything else retried.
func writeOutcome(err error) error {
	if errors.Is(err, ErrUnstorable) {
		return events.Permanent(err)
	}
	return err
}

// turnTools returns the definitions of the tools a model turn offered.
func turnTools(ctx context.Context, tools toolResolver, t *TurnRow) []ToolDefRow {
	var turn struct {
		Tools  []string  `json:"tools"`
		TStart time.Time `json:"t_start"`
	}
	if fastjson.Unmarshal(t.Turn, &turn) != nil {
		return nil
	}
	refs := make([]envelope.ToolRef, 0, len(turn.Tools))
	for _, s := range turn.Tools {
		if ref, err := envelope.ParseToolRef(s); err == nil {
			refs = append(refs, ref)
		}
	}
	defs := tools.definitions(ctx, refs, turn.TStart)
	for i := range defs {
		defs[i].RunID = t.RunID
	}
	return defs
}
