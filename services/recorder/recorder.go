// Package recorder is toolwire's recorder service: it consumes every run and
// tool call event, keeps each one in Postgres, materializes runs, tool calls,
// model turns and verdicts from them, and serves them over a read-only HTTP
// API.
//
// Delivery is at least once and the two streams have no order between them,
// so recording is idempotent and order-independent: an event is keyed by its
// id, and the materialized rows converge whatever order the events arrive in
// (see Store). A message is acknowledged only after the transaction holding
// its effects has committed; an event that cannot be decoded is dead-lettered.
package recorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/service"
)

// The recorder's durable consumers: one per stream, every event of each.
const (
	DurableRuns  = "recorder-runs"
	DurableCalls = "recorder-calls"
)

// maxConcurrency bounds the handlers of one consumer in one replica.
const maxConcurrency = 512

// ConsumerSpecs returns the recorder's consumers.
func ConsumerSpecs() []events.ConsumerSpec {
	return []events.ConsumerSpec{
		{Stream: events.StreamRuns, Durable: DurableRuns, Filters: []string{events.SubjectsRuns}},
		{Stream: events.StreamCalls, Durable: DurableCalls, Filters: []string{events.SubjectsCalls}},
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
	cfg    Config
	js     jetstream.JetStream
	log    *slog.Logger
	pool   *pgxpool.Pool
	store  *PostgresStore
	writer *batchWriter
	api    http.Handler

	mu      sync.Mutex
	state   lifecycle
	runners []*events.Runner
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
	pool, err := NewPool(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	store := NewPostgresStore(pool)
	return &Recorder{
		cfg:    cfg,
		js:     d.JS,
		log:    log,
		pool:   pool,
		store:  store,
		writer: newBatchWriter(store, cfg.Batch, log),
		api:    NewAPI(store, log),
	}, nil
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
func (r *Recorder) Store() Store { return r.store }

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
	res, err := Migrate(ctx, r.pool, r.log)
	if err != nil {
		return err
	}
	r.log.Info("schema ready", "version", res.Version, "applied", res.Applied)

	r.writer.start(ctx)
	for _, spec := range ConsumerSpecs() {
		runner, err := events.NewRunner(r.js, events.RunnerConfig{
			Spec:        spec,
			Handler:     r.handle,
			Concurrency: min(r.cfg.Batch, maxConcurrency),
			Logger:      r.log,
		})
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
	err := r.stopConsuming(ctx)
	r.pool.Close()
	return err
}

func (r *Recorder) stopConsuming(ctx context.Context) error {
	var errs []error
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
		err := r.pool.Ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("recorder: postgres unreachable: %w", err)
		}
		r.log.Warn("waiting for postgres", "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("recorder: postgres unreachable: %w", err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// handle records one event. An event that cannot be decoded, or whose data
// the database refuses, is dead-lettered at once (Permanent); any other
// failure is retried.
func (r *Recorder) handle(ctx context.Context, d *events.Delivery) error {
	rec, err := RecordOf(d.Event, d.Subject) //nolint:contextcheck // RecordOf does no I/O; it only parses
	if err != nil {
		return events.Permanent(err)
	}
	if d.Msg != nil {
		if meta, err := d.Msg.Metadata(); err == nil {
			rec.Event.Stream, rec.Event.StreamSeq = meta.Stream, meta.Sequence.Stream
		}
	}
	if err := r.writer.write(ctx, rec); err != nil {
		if errors.Is(err, ErrUnstorable) {
			return events.Permanent(err)
		}
		return err
	}
	return nil
}
