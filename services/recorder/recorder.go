// Package recorder is toolwire's recorder service: it consumes every run, tool
// call and sandbox event, keeps each one in Postgres (or, embedded, in SQLite),
// materializes runs, tool calls, model turns, verdicts and the tool
// definitions of replay bundles from them, and serves them over HTTP: the JSON
// API with its live event stream (package api) and the timeline pages
// (package pages).
//
// Where things are: this package is the service (Config, Build and New, the
// consumers, the batch writer, the tool definitions read from the registry);
// store holds the Store interface, its rules and RecordOf (event to record),
// with the backends in store/postgres and store/sqlite and the contract suite
// both pass in store/storetest; apitypes holds the API's response types for
// clients.
//
// Delivery is at least once and the streams have no order between them, so
// recording is idempotent and order-independent: an event is keyed by its id,
// and the materialized rows converge whatever order the events arrive in (see
// store.Store). A message is acknowledged only after the transaction holding
// its effects has committed; an event that cannot be decoded is dead-lettered.
// While the database is unreachable the recorder holds what it has and stops
// pulling; it catches up when the database is back (see batchWriter).
package recorder

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/pages"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// The recorder's three durable consumers: one per stream (runs, calls,
// sandbox), every event of each.
const (
	DurableRuns    = "recorder-runs"
	DurableCalls   = "recorder-calls"
	DurableSandbox = "recorder-sandbox"
)

// maxConcurrency bounds the handlers of one consumer in one replica.
const maxConcurrency = 512

// ConsumerSpecs returns the recorder's consumers.
func ConsumerSpecs() []provision.ConsumerSpec {
	return []provision.ConsumerSpec{
		{Stream: events.StreamRuns, Durable: DurableRuns, Filters: []string{events.SubjectsRuns}},
		{Stream: events.StreamCalls, Durable: DurableCalls, Filters: []string{events.SubjectsCalls}},
		{Stream: events.StreamSandbox, Durable: DurableSandbox, Filters: []string{events.SubjectsSandbox}},
	}
}

// Service is the recorder service. It is stateless between events: any
// number of replicas share its three durable consumers and its database.
type Service struct {
	service.Core

	cfg     Config
	db      *backend
	writer  *batchWriter
	handler http.Handler
	changes *api.Changes
	live    *live // the runs the API's clients wait on, followed live
	// retention is the gauge of the retention watch (retention.go).
	retention *prometheus.GaugeVec
	tools     toolResolver  // set by Start; nil without a tool registry
	streams   chan struct{} // closed at Stop: ends the live event streams
}

// New returns a recorder on d's JetStream and the database of cfg. It reads
// no environment and does no I/O: the database handle it opens connects on
// first use, in Start, which also migrates and starts consuming. Stop
// releases the handle whether or not Start ran.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	d, m, err := service.Prepare("recorder", d, cfg, newMetrics)
	if err != nil {
		return nil, err
	}
	if err := CheckExposure(d.Common.HTTPAddr, cfg); err != nil {
		return nil, err
	}
	db, err := openBackend(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	r := &Service{Core: d.Core("recorder", m.consumers), cfg: cfg, db: db, changes: api.NewChanges(), streams: make(chan struct{})}
	r.retention = m.retention
	if d.JS != nil {
		r.live = newLive(d.JS.Conn(), d.Log)
	}
	// Released last, in this order, after what Start registers: the live
	// streams end once the consumers have drained, then the database closes.
	r.OnStopFunc(db.close)
	r.OnStopFunc(func() { close(r.streams) })

	r.writer = newBatchWriter(db.store, cfg.Batch, d.Log)
	r.writer.ping, r.writer.writers = db.ping, db.writers
	r.writer.tracer, r.writer.kind = r.Tracer, db.kind
	r.writer.onCommit = func(recs []store.Record) {
		m.recorded.Add(float64(len(recs)))
		r.live.recorded(recs) // before the streams wake: they send the turns, not their deltas
		r.changes.Notify(recs)
	}
	r.writer.onState = func(up bool) {
		if up {
			m.dbUp.Set(1)
			return
		}
		m.dbUp.Set(0)
		m.outages.Inc()
	}
	authn, err := auth.New(cfg.Auth(), db.store, d.Log)
	if err != nil {
		db.close()
		return nil, fmt.Errorf("recorder: %w", err)
	}
	switch {
	case cfg.Auth().On():
		d.Log.Info("authentication on: reads are scoped to each caller's tenant", "oidc_issuer", cfg.OIDC.Issuer)
	case cfg.InsecureNoAuth:
		d.Log.Warn("AUTHENTICATION OFF ON PURPOSE (" + EnvInsecureNoAuth + "=1): everyone who reaches this recorder's HTTP port reads every tenant's runs, tool inputs and outputs")
	}
	mux := http.NewServeMux()
	var (
		watch  api.Watcher
		deltas api.DeltaSource
	)
	if r.live != nil {
		watch, deltas = r.live, r.live
	}
	mux.Handle("/v1/", api.New(db.store, api.Options{Log: d.Log, Changes: r.changes, Live: watch, Deltas: deltas, JS: d.JS, Done: r.streams,
		AdminToken: cfg.AdminToken, Auth: authn, StreamWait: cfg.StreamWait}))
	var (
		catalog *api.Catalog
		runs    *api.Runs
	)
	if d.JS != nil {
		catalog = api.NewCatalog(d.JS, d.Log)
		if runs, err = api.NewRuns(db.store, d.JS, d.Log); err != nil {
			db.close()
			return nil, fmt.Errorf("recorder: %w", err)
		}
	}
	mux.Handle("/", pages.New(db.store, pages.Options{Log: d.Log, Auth: authn, JS: d.JS, Catalog: catalog, Runs: runs, InsecureCookie: cfg.InsecureCookie,
		MCPStdio: cfg.MCPStdio}))
	r.handler = embeddable(mux, cfg.CORSOrigins)
	return r, nil
}

// Option adjusts the configuration Build read from the environment (stack
// sets the database of `toolwire dev` with one).
type Option func(*Config)

// Build reads the configuration from d.Getenv, applies opts and calls New. It
// is what the recorder binary and `toolwire dev` run.
func Build(d service.Deps, opts ...Option) (*Service, error) {
	return service.BuildFrom("recorder", d, ConfigFromEnv, New, opts...)
}

// Config returns the configuration the recorder runs with.
func (r *Service) Config() Config { return r.cfg }

// Handler returns the recorder's HTTP server: the JSON API under /v1/
// (package api) and the timeline pages at / (package pages).
func (r *Service) Handler() http.Handler { return r.handler }

// DatabaseUp reports whether the database answered the last write: false while
// the recorder holds events for it.
func (r *Service) DatabaseUp() bool { return !r.writer.holding() }

// Start waits for the database (until ctx ends), migrates its schema, watches
// the tool registry and starts consuming. ctx bounds the start; the consumers,
// the writer and the registry watch run until Stop.
func (r *Service) Start(ctx context.Context) error {
	return r.StartWith(ctx, func(ctx, life context.Context) error {
		if r.db.prepare != nil {
			if err := r.db.prepare(); err != nil {
				return fmt.Errorf("recorder: %w", err)
			}
		}
		if err := r.waitForDatabase(ctx); err != nil {
			return err
		}
		res, err := r.db.migrate(ctx, r.Log)
		if err != nil {
			return err
		}
		r.Log.Info("schema ready", "store", r.db.kind, "at", r.db.where, "version", res.Version, "applied", res.Applied)
		if tools, err := newRegistryResolver(ctx, r.JS, r.Log); err != nil {
			r.Log.Warn("no tool registry: replay bundles will lack tool definitions", "err", err)
		} else {
			r.tools = tools
			r.OnStopFunc(tools.stop) // after the consumers, whose handlers read it
		}

		r.writer.start(life)
		r.OnStop(r.stopWriter)    // once the consumers have drained: their batches commit first
		r.OnStop(r.stopConsuming) // first
		for _, spec := range ConsumerSpecs() {
			// A short ack wait: what a NATS restart lost comes back within
			// it; the runner extends what it holds (see Config.AckWait).
			spec.AckWait = r.cfg.AckWait
			rc := consume.RunnerConfig{
				Spec:        spec,
				Handler:     r.handle,
				Concurrency: min(r.cfg.Batch, maxConcurrency),
				Logger:      r.Log,
				Poll:        max(r.cfg.Poll, 0),
			}
			if rc.Poll > 0 {
				// Each fetch is decoded on one goroutine and written as one
				// batch: the recorder never has hundreds of handlers runnable at
				// once beside the services on the same CPUs.
				rc.Batch = r.handleBatch
			}
			runner, err := r.Runners.Start(ctx, r.JS, rc)
			if err != nil {
				return fmt.Errorf("recorder: consumer %s: %w", spec.Durable, err)
			}
			if r.live != nil {
				r.live.setNudge(spec.Stream, runner.Nudge)
			}
		}
		r.Go(life, func(life context.Context) { r.watchRetention(life, r.retention) })
		return nil
	})
}

// stopConsuming drains the consumers: the handlers in flight finish, their
// batches commit and they are acknowledged.
func (r *Service) stopConsuming(ctx context.Context) error {
	if r.writer.holding() {
		// The database is down: the handlers in flight wait for it and the
		// drain would wait for them. Stop the writer first: they fail, and
		// their messages are redelivered to the next recorder.
		if err := r.stopWriter(ctx); err != nil {
			return errors.Join(err, r.Runners.Stop(ctx))
		}
	}
	return r.Runners.Stop(ctx)
}

// stopWriter stops the batch writer once its batch in progress is written.
func (r *Service) stopWriter(ctx context.Context) error {
	if err := r.writer.stop(ctx); err != nil {
		return fmt.Errorf("recorder: stop writer: %w", err)
	}
	return nil
}

// waitForDatabase pings the database until it answers, for at most
// Config.DatabaseWait (and within ctx, the start's): a database that never
// answers fails the start with what to check, rather than a recorder that
// waits forever, saying only that it waits.
func (r *Service) waitForDatabase(ctx context.Context) error {
	wait := r.cfg.DatabaseWait
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		err := r.db.ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			r.Log.Warn("waiting for the database", "store", r.db.kind, "at", r.db.where, "retry_in", delay,
				"gives_up_in", wait, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
		}
		if ctx.Err() != nil {
			return &DatabaseUnreachableError{Kind: r.db.kind, Where: r.db.where, Waited: wait, Err: err}
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// DatabaseUnreachableError is the error of a Start whose database did not
// answer within Config.DatabaseWait.
type DatabaseUnreachableError struct {
	Kind   string // "postgres" or "sqlite"
	Where  string // the database, without a password
	Waited time.Duration
	Err    error // the last attempt's
}

func (e *DatabaseUnreachableError) Error() string {
	check := "that the file's folder exists and is writable"
	if e.Kind == "postgres" {
		check = "that Postgres runs and that " + EnvDatabaseURL + " names it (host, port, user, database, sslmode)"
	}
	return fmt.Sprintf("recorder: the %s database at %s did not answer within %s: %v; check %s, or wait longer with %s",
		e.Kind, e.Where, e.Waited, e.Err, check, EnvDatabaseWait)
}

func (e *DatabaseUnreachableError) Unwrap() error { return e.Err }

// handle records one event. An event that cannot be decoded, or whose data
// the database refuses, is dead-lettered at once (Permanent); any other
// failure is retried.
func (r *Service) handle(ctx context.Context, d *consume.Delivery) error {
	rec, err := r.recordOf(ctx, d)
	if err != nil {
		return err
	}
	return writeOutcome(r.writer.write(ctx, rec))
}

// handleBatch records a fetch's events: each decoded as handle does, all
// handed to the writer at once; errs[i] is what handle would return for
// ds[i].
func (r *Service) handleBatch(ctx context.Context, ds []*consume.Delivery) []error {
	errs := make([]error, len(ds))
	recs := make([]store.Record, 0, len(ds))
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
func (r *Service) recordOf(ctx context.Context, d *consume.Delivery) (store.Record, error) {
	rec, err := store.RecordOf(d.Event, d.Subject) //nolint:contextcheck // RecordOf does no I/O; it only parses
	if err != nil {
		return store.Record{}, consume.Permanent(err)
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
	if errors.Is(err, store.ErrUnstorable) {
		return consume.Permanent(err)
	}
	return err
}

// turnTools returns the definitions of the tools a model turn offered.
func turnTools(ctx context.Context, tools toolResolver, t *store.TurnRow) []store.ToolDefRow {
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
