package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

// The worker's side of the protocol of pkg/events/worker.go: register the
// tools of each queue with the executors, answer the calls they hand over,
// announce itself while it runs. It holds no JetStream access: the
// executor runs the pipeline around each call (docs/tools.md, Workers).

// rpcTimeout bounds each request to the executors.
const rpcTimeout = 10 * time.Second

// server serves a worker's tools on their queues.
type server struct {
	w        *Worker
	nc       *nats.Conn
	log      *slog.Logger
	byQueue  map[string][]envelope.ToolDefinition
	tools    map[string]*Tool // by name@version
	instance string
	id       string
	started  time.Time
	slots    chan struct{}

	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec

	subs []*nats.Subscription
	// cancelSubs receive the executors' cancels: kept until the calls in
	// flight at a stop are over.
	cancelSubs []*nats.Subscription
	cancels    *callCancels
	inflight   sync.WaitGroup
	stopBeat   chan struct{}
	beatDone   chan struct{}
	stopOnce   sync.Once
	stopErr    error
}

func newServer(w *Worker, nc *nats.Conn, defs []envelope.ToolDefinition, log *slog.Logger, metrics prometheus.Registerer) (*server, error) {
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("worker: instance: %w", err)
	}
	s := &server{w: w, nc: nc, log: log, byQueue: map[string][]envelope.ToolDefinition{}, tools: map[string]*Tool{},
		instance: hex.EncodeToString(nonce), started: time.Now().UTC(), id: workerID(w.cfg), cancels: newCallCancels(),
		slots:    make(chan struct{}, cmpOr(w.cfg.Concurrency, envInt(w.cfg, EnvConcurrency, DefaultConcurrency))),
		stopBeat: make(chan struct{}), beatDone: make(chan struct{})}
	s.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toolwire_worker_tool_calls_total", Help: "Calls the worker ran, by tool and outcome (ok or the error code).",
	}, []string{"tool", "code"})
	s.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "toolwire_worker_tool_duration_seconds", Help: "How long the worker's tools ran.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"tool"})
	if m := metrics; m != nil {
		for _, c := range []prometheus.Collector{s.calls, s.duration} {
			if err := m.Register(c); err != nil {
				return nil, fmt.Errorf("worker: metrics: %w", err)
			}
		}
	}
	for i, d := range defs {
		s.byQueue[d.Queue] = append(s.byQueue[d.Queue], d)
		cp := *w.tools[i]
		cp.def = d // with its queue
		s.tools[d.Ref().String()] = &cp
	}
	return s, nil
}

// workerID is Config.ID, else TOOLWIRE_WORKER_ID, else <hostname>-<pid>.
func workerID(cfg Config) string {
	if cfg.ID != "" {
		return cfg.ID
	}
	if cfg.Getenv != nil {
		if v := cfg.Getenv(EnvID); v != "" {
			return v
		}
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", cmpOr(host, "worker"), os.Getpid())
}

// The worker's settings in the environment, for a Config that leaves them
// unset.
const (
	EnvID          = "TOOLWIRE_WORKER_ID"          // Config.ID
	EnvConcurrency = "TOOLWIRE_WORKER_CONCURRENCY" // Config.Concurrency
	EnvHeartbeat   = "TOOLWIRE_WORKER_HEARTBEAT"   // Config.Heartbeat, a duration
)

// envInt reads a positive integer setting; def when unset or not one.
func envInt(cfg Config, key string, def int) int {
	if cfg.Getenv == nil {
		return def
	}
	if n, err := strconv.Atoi(cfg.Getenv(key)); err == nil && n > 0 {
		return n
	}
	return def
}

// heartbeat is Config.Heartbeat, else TOOLWIRE_WORKER_HEARTBEAT, else
// DefaultHeartbeat; at least a second.
func heartbeat(cfg Config) time.Duration {
	d := cfg.Heartbeat
	if d == 0 && cfg.Getenv != nil {
		d, _ = time.ParseDuration(cfg.Getenv(EnvHeartbeat))
	}
	if d <= 0 {
		d = DefaultHeartbeat
	}
	return max(d, time.Second)
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// start registers every queue's tools (a version the registry holds with
// another definition is refused: ErrConflict), subscribes to the queues'
// calls and sends the first heartbeats.
func (s *server) start(ctx context.Context) error {
	var errs []error
	for _, q := range s.w.queues(s.defs()) {
		reg := events.WorkerRegistration{Tools: s.byQueue[q]}
		if err := s.ask(ctx, q, events.WorkerRegister, reg); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, d := range s.byQueue[q] {
			s.log.Info("tool registered", "tool", d.Ref().String(), "queue", q)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for q := range s.byQueue {
		// A call goes to one replica (the queue group); a cancel to every
		// one, as the executor does not know which took the call.
		call, err := events.WorkerCallSubject(q)
		if err != nil {
			return err
		}
		preview, err := events.WorkerPreviewSubject(q)
		if err != nil {
			return err
		}
		cancel, err := events.WorkerCancelSubject(q)
		if err != nil {
			return err
		}
		for _, subj := range []string{call, preview, cancel} {
			var sub *nats.Subscription
			if subj == cancel {
				sub, err = s.nc.Subscribe(subj, s.cancel)
				if sub != nil {
					s.cancelSubs = append(s.cancelSubs, sub)
				}
			} else {
				sub, err = s.nc.QueueSubscribe(subj, events.QueueWorkerCalls, s.receive)
				if sub != nil {
					s.subs = append(s.subs, sub)
				}
			}
			if err != nil {
				s.unsubscribe()
				s.unsubscribeCancels()
				return fmt.Errorf("worker: serve queue %s: %w", q, err)
			}
		}
	}
	if err := s.nc.FlushTimeout(rpcTimeout); err != nil {
		s.unsubscribe()
		s.unsubscribeCancels()
		return fmt.Errorf("worker: %w", err)
	}
	if err := s.beat(ctx, events.WorkerBeat); err != nil {
		s.unsubscribe()
		s.unsubscribeCancels()
		return err
	}
	go s.beats()
	s.log.Info("worker started", "instance", s.instance, "queues", s.w.queues(s.defs()), "tools", len(s.tools))
	return nil
}

func (s *server) defs() []envelope.ToolDefinition {
	var out []envelope.ToolDefinition
	for _, ds := range s.byQueue {
		out = append(out, ds...)
	}
	return out
}

// ask sends one request to the executors and returns their refusal as an
// error (ErrConflict for a changed version).
func (s *server) ask(ctx context.Context, queue, verb string, body any) error {
	subj, err := events.WorkerRPCSubject(queue, verb)
	if err != nil {
		return err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	m, err := s.nc.RequestWithContext(ctx, subj, b)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("worker: queue %s: no toolwire executor answers (%w): start toolwire, or check that this worker's identity serves queue %s", queue, err, queue)
	}
	if err != nil {
		return fmt.Errorf("worker: queue %s: %s: %w", queue, verb, err)
	}
	var r events.WorkerReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("worker: queue %s: %s: the executor's answer: %w", queue, verb, err)
	}
	switch {
	case r.Error == "":
		return nil
	case r.Code == events.WorkerConflict:
		return fmt.Errorf("worker: %w: %s", ErrConflict, r.Error)
	default:
		return fmt.Errorf("worker: queue %s: %s refused (%s): %s", queue, verb, r.Code, r.Error)
	}
}

// beat announces the worker on each of its queues.
func (s *server) beat(ctx context.Context, verb string) error {
	every := heartbeat(s.w.cfg)
	tools := make([]string, 0, len(s.tools))
	var errs []error
	for q, defs := range s.byQueue {
		tools = tools[:0]
		for _, d := range defs {
			tools = append(tools, d.Ref().String())
		}
		hb := events.WorkerHeartbeat{Instance: s.instance, ID: s.id, Tools: tools,
			StartedAt: s.started, TTLMS: (3 * every).Milliseconds()}
		if err := s.ask(ctx, q, verb, hb); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *server) beats() {
	defer close(s.beatDone)
	t := time.NewTicker(heartbeat(s.w.cfg))
	defer t.Stop()
	for {
		select {
		case <-s.stopBeat:
			return
		case <-t.C:
			if err := s.beat(context.Background(), events.WorkerBeat); err != nil {
				s.log.Warn("heartbeat not taken", "err", err)
			}
		}
	}
}

// receive takes one call or preview; it runs in a goroutine of its own once
// a slot is free, so that slow tools do not hold the subscription.
func (s *server) receive(m *nats.Msg) {
	s.inflight.Add(1)
	s.slots <- struct{}{}
	go func() {
		defer func() { <-s.slots; s.inflight.Done() }()
		// Taken: the executor watches this instance's heartbeat until the
		// result comes.
		if b, err := json.Marshal(events.WorkerResult{Accepted: &events.WorkerAccepted{Instance: s.instance, ID: s.id}}); err == nil {
			if err := m.Respond(b); err != nil {
				s.log.Warn("cannot accept a call", "subject", m.Subject, "err", err)
			}
		}
		res := s.serve(m)
		b, err := json.Marshal(res)
		if err == nil && len(b) > int(s.nc.MaxPayload()) {
			b, err = json.Marshal(events.WorkerResult{Error: envelope.NewToolError(envelope.CodeUnknown,
				"the output of the tool is %d bytes, more than this NATS server carries (%d)", len(b), s.nc.MaxPayload())})
		}
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil {
			s.log.Warn("cannot answer a call", "subject", m.Subject, "err", err)
		}
	}()
}

func (s *server) serve(m *nats.Msg) (res events.WorkerResult) {
	var c events.WorkerCall
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeValidation, "worker: the call is not one: %v", err)}
	}
	if err := c.Validate(); err != nil {
		return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeValidation, "worker: %v", err)}
	}
	ref := envelope.ToolRef{Name: c.Name, Version: c.Version}
	t, ok := s.tools[ref.String()]
	var callSubj, previewSubj string
	if ok {
		callSubj, _ = events.WorkerCallSubject(t.def.Queue)
		previewSubj, _ = events.WorkerPreviewSubject(t.def.Queue)
	}
	if !ok || (m.Subject != callSubj && m.Subject != previewSubj) {
		return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeUnknown, "worker: tool %s is not served by this worker on this queue", ref)}
	}
	scrub := secrets.NewScrubber(c.Secrets)
	log := scrub.Logger(s.log.With("run_id", c.RunID, "call_id", c.CallID, "tool", ref.String()))
	run, preview := t.run, m.Subject == previewSubj
	if preview {
		// A tool without WithPreview declares no supports_preview, so the
		// Policy Guard asks for none.
		if t.preview == nil {
			return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeUnknown, "tool %s has no preview", ref)}
		}
		run = t.preview
	}
	// The call's context ends at its timeout, or when the executor says
	// its run was cancelled (cancel.go).
	ctx, cut := context.WithCancelCause(context.Background())
	defer cut(nil)
	untrack, said := s.cancels.track(c.RunID, c.CallID, cut)
	if untrack == nil {
		log.Info("call of a cancelled run not started", "reason", said)
		return events.WorkerResult{Error: events.CancelledCallError(false, said)}
	}
	defer untrack()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout())
	defer cancel()
	ctx = context.WithValue(ctx, callKey{}, Call{TenantID: c.TenantID, RunID: c.RunID, CallID: c.CallID, Secrets: c.Secrets, Log: log})
	// Counted once the outcome is final: this runs after the recovery below.
	begun := time.Now()
	defer func() {
		if preview {
			return // a dry run is not a call
		}
		code := "ok"
		if res.Error != nil {
			code = string(res.Error.Code)
		}
		s.calls.WithLabelValues(ref.String(), code).Inc()
		s.duration.WithLabelValues(ref.String()).Observe(time.Since(begun).Seconds())
	}()
	defer func() {
		if p := recover(); p != nil {
			log.Error("tool panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res = events.WorkerResult{Error: envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)}
		}
	}()
	out, err := run(ctx, c.Input)
	if err != nil {
		var te *envelope.ToolError
		switch {
		case cancelledBy(ctx) != "":
			log.Info("call stopped: its run was cancelled", "reason", cancelledBy(ctx))
			return events.WorkerResult{Error: events.CancelledCallError(true, cancelledBy(ctx))}
		case errors.As(err, &te):
			cp := *te
			cp.Message = scrub.String(cp.Message)
			return events.WorkerResult{Error: &cp}
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeTimeout, "tool %s ran past its timeout of %s", ref, c.Timeout())}
		default:
			log.Error("tool failed", "err", scrub.Error(err))
			return events.WorkerResult{Error: envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)}
		}
	}
	return events.WorkerResult{Output: out}
}

func (s *server) unsubscribe() {
	for _, sub := range s.subs {
		_ = sub.Drain()
	}
}

func (s *server) unsubscribeCancels() {
	for _, sub := range s.cancelSubs {
		_ = sub.Unsubscribe()
	}
}

// drained waits, bounded by ctx, until the subscriptions have handed over
// every call they had taken.
func (s *server) drained(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		valid := false
		for _, sub := range s.subs {
			valid = valid || sub.IsValid()
		}
		if !valid {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// stop stops taking calls, waits (bounded by ctx) for those in flight and
// withdraws the worker's heartbeats.
func (s *server) stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		close(s.stopBeat)
		<-s.beatDone
		s.unsubscribe()
		if err := s.drained(ctx); err != nil {
			s.stopErr = fmt.Errorf("worker: calls still queued at stop: %w", err)
		} else {
			done := make(chan struct{})
			go func() { s.inflight.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.stopErr = fmt.Errorf("worker: calls still running at stop: %w", ctx.Err())
			}
		}
		s.unsubscribeCancels() // no call of this worker runs any more
		if err := s.beat(ctx, events.WorkerLeave); err != nil {
			s.log.Warn("leave not taken", "err", err)
		}
		s.log.Info("worker stopped", "instance", s.instance)
	})
	return s.stopErr
}
