package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Workers (pkg/events/worker.go: the protocol; docs/tools.md, Workers). A
// worker holds no JetStream access: the executor consumes its queues'
// approved calls, runs each through the pipeline as it runs its own tools,
// and hands the tool's run to the worker as a request. It also answers the
// workers' requests: the registration of their tools (only on the queue the
// request's subject names, which the server lets only that queue's worker
// reach; a registered version is never changed) and their heartbeats,
// which it keeps in the workers bucket for the Policy Guard.

// workerRPCTimeout bounds the executor's answer to one worker request.
const workerRPCTimeout = 10 * time.Second

// workerLiveCheck is how often the executor checks, while a worker runs a
// call, that the worker's heartbeat still holds.
const workerLiveCheck = time.Second

// workerQueues are the worker queues this executor consumes.
type workerQueues struct {
	mu      sync.Mutex
	started map[string]bool
	life    context.Context
}

// ownQueue reports whether the executor runs queue's tools in process
// (a queue name, never "": a definition's is its QueueName).
func (s *Service) ownQueue(queue string) bool {
	return slices.Contains(s.cfg.Queues, queue)
}

// serveWorkers answers the workers' requests until life ends, and consumes
// the queues of the workers alive now.
func (s *Service) serveWorkers(ctx, life context.Context) (func(), error) {
	s.workers = &workerQueues{started: map[string]bool{}, life: life}
	nc := s.JS.Conn()
	sub, err := nc.QueueSubscribe(events.SubjectsWorkerRPC, events.QueueWorkerRPC, func(m *nats.Msg) {
		go s.answerWorker(life, m)
	})
	if err != nil {
		return nil, fmt.Errorf("executor: worker requests: %w", err)
	}
	if err := nc.FlushTimeout(workerRPCTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("executor: worker requests: %w", err)
	}
	live, err := registry.ListWorkers(ctx, s.JS, s.now())
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("executor: workers: %w", err)
	}
	for _, w := range live {
		if w.Remote && !s.ownQueue(w.Queue) {
			if err := s.consumeWorkerQueue(ctx, w.Queue); err != nil {
				_ = sub.Unsubscribe()
				return nil, err
			}
		}
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// consumeWorkerQueue starts consuming queue's approved calls, once.
func (s *Service) consumeWorkerQueue(ctx context.Context, queue string) error {
	w := s.workers
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started[queue] || w.life.Err() != nil {
		return nil
	}
	filter, err := events.ApprovedFilter(queue)
	if err != nil {
		return err
	}
	_, err = s.Runners.Start(ctx, s.JS, consume.RunnerConfig{
		Spec: provision.ConsumerSpec{
			Stream: events.StreamCalls, Durable: DurableFor(queue), Filters: []string{filter},
			MaxAckPending: maxAckPending, MaxDeliver: maxDeliver, AckWait: s.cfg.AckWait,
		},
		Handler: s.handle, Concurrency: s.cfg.Concurrency, Logger: s.Log.With("queue", queue, "worker_queue", true),
	})
	if err != nil {
		return fmt.Errorf("executor: consume worker queue %s: %w", queue, err)
	}
	w.started[queue] = true
	s.Log.Info("consuming a worker queue", "queue", queue)
	return nil
}

// answerWorker answers one worker request.
func (s *Service) answerWorker(life context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(life, workerRPCTimeout)
	defer cancel()
	reply := s.workerRequest(ctx, m)
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(reply)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		s.Log.Warn("worker request: cannot answer", "subject", m.Subject, "err", err)
	}
}

func refuse(code events.WorkerReplyCode, format string, args ...any) events.WorkerReply {
	return events.WorkerReply{Code: code, Error: fmt.Sprintf(format, args...)}
}

func (s *Service) workerRequest(ctx context.Context, m *nats.Msg) events.WorkerReply {
	queue, verb, err := events.ParseWorkerRPC(m.Subject)
	if err != nil {
		return refuse(events.WorkerInvalid, "%v", err)
	}
	if s.ownQueue(queue) {
		return refuse(events.WorkerForbidden, "queue %s is the executor's own: a worker serves a queue of its own", queue)
	}
	log := s.Log.With("queue", queue, "request", verb)
	switch verb {
	case events.WorkerRegister:
		var r events.WorkerRegistration
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return refuse(events.WorkerInvalid, "registration: %v", err)
		}
		return s.registerWorkerTools(ctx, queue, r.Tools, log)
	case events.WorkerBeat, events.WorkerLeave:
		var hb events.WorkerHeartbeat
		if err := json.Unmarshal(m.Data, &hb); err != nil {
			return refuse(events.WorkerInvalid, "heartbeat: %v", err)
		}
		if verb == events.WorkerLeave {
			if err := registry.Leave(ctx, s.JS, queue, hb.Instance); err != nil {
				return refuse(events.WorkerInvalid, "leave: %v", err)
			}
			return events.WorkerReply{}
		}
		w := registry.Worker{Queue: queue, Instance: hb.Instance, ID: hb.ID, Tools: hb.Tools,
			StartedAt: hb.StartedAt, TTL: time.Duration(hb.TTLMS) * time.Millisecond, Remote: true}
		if err := w.Validate(); err != nil {
			return refuse(events.WorkerInvalid, "heartbeat: %v", err)
		}
		if err := registry.Beat(ctx, s.JS, w, s.now()); err != nil {
			return refuse(events.WorkerUnavailable, "heartbeat: %v", err)
		}
		if err := s.consumeWorkerQueue(ctx, queue); err != nil {
			log.Error("cannot consume a worker queue", "err", err)
			return refuse(events.WorkerUnavailable, "%v", err)
		}
		return events.WorkerReply{}
	}
	return refuse(events.WorkerInvalid, "unknown request %q", verb)
}

// registerWorkerTools registers a worker's tools on its queue: each must
// name that queue and be a Go tool of the worker (kind builtin); a version
// the registry holds with another definition is refused, never replaced.
func (s *Service) registerWorkerTools(ctx context.Context, queue string, defs []envelope.ToolDefinition, log *slog.Logger) events.WorkerReply {
	if len(defs) == 0 {
		return refuse(events.WorkerInvalid, "registration names no tool")
	}
	for i := range defs {
		d := &defs[i]
		if err := d.Validate(); err != nil {
			return refuse(events.WorkerInvalid, "tool %s: %v", d.Ref(), err)
		}
		if d.QueueName() != queue {
			return refuse(events.WorkerForbidden, "tool %s is on queue %q: a worker of queue %s registers only tools of %s", d.Ref(), d.QueueName(), queue, queue)
		}
		if d.Timeout() > events.MaxWorkerTimeout {
			return refuse(events.WorkerInvalid, "tool %s: a worker's tool times out within %s, not %s", d.Ref(), events.MaxWorkerTimeout, d.Timeout())
		}
		if d.Implementation.Kind != envelope.ImplBuiltin {
			return refuse(events.WorkerForbidden, "tool %s is a %s tool: a worker registers only its own Go tools (kind builtin)", d.Ref(), d.Implementation.Kind)
		}
	}
	for _, d := range defs {
		created, err := s.reg.Register(ctx, d)
		switch {
		case errors.Is(err, registry.ErrConflict):
			return refuse(events.WorkerConflict, "%v", err)
		case err != nil:
			return refuse(events.WorkerUnavailable, "register %s: %v", d.Ref(), err)
		}
		log.Info("worker tool registered", "tool", d.Ref().String(), "new", created)
	}
	if err := s.consumeWorkerQueue(ctx, queue); err != nil {
		return refuse(events.WorkerUnavailable, "%v", err)
	}
	return events.WorkerReply{}
}

// workerTool runs a registry entry of a worker's queue: the worker runs it
// and answers.
type workerTool struct {
	s     *Service
	def   envelope.ToolDefinition
	queue string
}

func (t workerTool) Definition() envelope.ToolDefinition { return t.def }

func (t workerTool) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	subj, err := events.WorkerCallSubject(t.queue)
	if err != nil {
		return nil, err
	}
	return t.ask(ctx, subj, input, tc)
}

func (t workerTool) Preview(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	subj, err := events.WorkerPreviewSubject(t.queue)
	if err != nil {
		return nil, err
	}
	return t.ask(ctx, subj, input, tc)
}

// ask hands the call to a worker of the queue and waits for its answer. A
// worker that dies holding the call leaves its outcome unknown, unless the
// tool declares idempotent retries and tc.Rerun allows another run: the call
// is then handed over again, with the same run and call ids.
func (t workerTool) ask(ctx context.Context, subject string, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	var before *events.WorkerAccepted // the worker that died holding the call's last run
	for {
		out, lost, err := t.askOnce(ctx, subject, input, tc)
		if te, ok := errors.AsType[*envelope.ToolError](err); ok && before != nil && te.Code == envelope.CodeNetworkError {
			// No worker to hand the call over to: the earlier run's
			// outcome is what is unknown.
			return nil, t.unknown(before, "no worker of the queue was there to take it again")
		}
		if lost == nil {
			return out, err
		}
		if tc.Rerun == nil || ctx.Err() != nil || !tc.Rerun() {
			// No other run: the tool declares none, its bounds are
			// reached, or the call's context ended (its time, a shutdown,
			// its claim lost), after which no run may start.
			return nil, t.unknown(lost, "")
		}
		before = lost
	}
}

// unknown is the error of a call whose worker (w) stopped during it: its
// outcome is not known. why says why a tool that declares idempotent
// retries was not retried.
func (t workerTool) unknown(w *events.WorkerAccepted, why string) *envelope.ToolError {
	details := map[string]any{"outcome": "unknown", "worker": w.ID, "queue": t.queue}
	if why != "" {
		details["not_retried"] = why
	}
	return envelope.NewToolError(envelope.CodeUnknown,
		"outcome unknown: worker %s of queue %s stopped during the call; it was not retried", w.ID, t.queue).WithDetails(details)
}

// askOnce hands the call to a worker once. lost, when set, is the worker
// that took the call and stopped before it answered.
func (t workerTool) askOnce(ctx context.Context, subject string, input json.RawMessage, tc toolapi.Context) (out json.RawMessage, lost *events.WorkerAccepted, err error) {
	timeout := t.def.Timeout()
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	call := events.WorkerCall{Name: t.def.Name, Version: t.def.Version, Input: input,
		TenantID: tc.TenantID, RunID: tc.RunID, CallID: tc.CallID, Secrets: tc.Auth,
		TimeoutMS: max(timeout.Milliseconds(), 1)}
	b, err := json.Marshal(call)
	if err != nil {
		return nil, nil, err
	}
	nc := t.s.JS.Conn()
	answers := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(nc.NewRespInbox(), answers)
	if err != nil {
		return nil, nil, fmt.Errorf("worker of queue %s: %w", t.queue, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, sub.Subject, b); err != nil {
		return nil, nil, fmt.Errorf("worker of queue %s: %w", t.queue, err)
	}
	check := time.NewTicker(workerLiveCheck)
	defer check.Stop()
	var taken *events.WorkerAccepted
	for {
		select {
		case <-ctx.Done():
			if said := cancels.CancelledBy(ctx); said != "" {
				// Its run was cancelled: the worker that has it stops it
				// too. The call is answered now, without waiting for the
				// worker (whose late answer goes nowhere).
				t.cancel(tc, said)
			}
			return nil, nil, ctx.Err()
		case <-check.C:
			if taken == nil {
				continue
			}
			live, err := registry.WorkerLive(ctx, t.s.JS, t.queue, taken.Instance, t.s.now())
			if err != nil || live {
				continue // the bucket did not answer: wait on, bounded by the timeout
			}
			return nil, taken, nil
		case m := <-answers:
			if m.Header.Get("Status") == "503" {
				return nil, nil, envelope.NewToolError(envelope.CodeNetworkError,
					"no worker serves queue %s now (tool %s): start one, or retry later", t.queue, t.def.Ref())
			}
			var res events.WorkerResult
			if err := json.Unmarshal(m.Data, &res); err != nil {
				return nil, nil, envelope.NewToolError(envelope.CodeUnknown, "the worker of queue %s answered something that is not a result", t.queue)
			}
			switch {
			case res.Accepted != nil:
				taken = res.Accepted
			case res.Error != nil:
				return nil, nil, res.Error
			case len(res.Output) == 0:
				return nil, nil, envelope.NewToolError(envelope.CodeUnknown, "the worker of queue %s answered no output", t.queue)
			default:
				return res.Output, nil, nil
			}
		}
	}
}

// cancel tells every worker of the queue to stop the call (tc), its run
// cancelled: said is why. A worker that missed it (it restarted) runs the
// call to its end, unread.
func (t workerTool) cancel(tc toolapi.Context, said string) {
	subj, err := events.WorkerCancelSubject(t.queue)
	if err != nil {
		return
	}
	b, err := json.Marshal(events.WorkerCancel{RunID: tc.RunID, CallID: tc.CallID, Reason: said})
	if err == nil {
		err = t.s.JS.Conn().Publish(subj, b)
	}
	if err != nil {
		t.s.Log.Warn("cannot tell the worker to stop a cancelled call", "queue", t.queue, "run_id", tc.RunID, "call_id", tc.CallID, "err", err)
	}
}
