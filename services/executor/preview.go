package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Previews: a tool that implements toolapi.Previewer and whose definition
// declares supports_preview gets a dry run when the Policy Guard asks for one
// (a call that needs an operator's approval carries it).

// maxConcurrentPreviews bounds the previews one replica runs at once.
const maxConcurrentPreviews = 8

// previewServer answers the guard's preview requests (events.SubjectPreview,
// core NATS request/reply in the queue group events.QueuePreview: one
// replica answers each).
type previewServer struct {
	sub    *nats.Subscription
	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	wg     sync.WaitGroup
}

// servePreviews subscribes to preview requests until stop; the previews run
// under life (the service's lifetime), and stop cancels those in flight.
func (s *Service) servePreviews(life context.Context) (*previewServer, error) {
	pctx, cancel := context.WithCancel(life)
	p := &previewServer{ctx: pctx, cancel: cancel, sem: make(chan struct{}, maxConcurrentPreviews)}
	sub, err := s.JS.Conn().QueueSubscribe(events.SubjectPreview, events.QueuePreview, func(m *nats.Msg) {
		p.sem <- struct{}{}
		p.wg.Add(1)
		go func() {
			defer func() { <-p.sem; p.wg.Done() }()
			s.answerPreview(p.ctx, m)
		}()
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("subscribe %s: %w", events.SubjectPreview, err)
	}
	p.sub = sub
	return p, nil
}

// stop unsubscribes and waits for the previews in flight, which are
// cancelled.
func (p *previewServer) stop() {
	_ = p.sub.Unsubscribe()
	p.cancel()
	p.wg.Wait()
}

func (s *Service) answerPreview(ctx context.Context, m *nats.Msg) {
	reply := func(p events.ApprovalPreview) {
		b, err := json.Marshal(p)
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
			s.Log.Warn("preview reply failed", "err", err)
		}
	}
	unavailable := func(format string, args ...any) {
		reply(events.ApprovalPreview{Unavailable: "preview unavailable: " + fmt.Sprintf(format, args...)})
	}
	var req events.CallRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		unavailable("the request is not a call: %v", err)
		return
	}
	if err := errors.Join(events.ValidateRunID(req.RunID), events.ValidateCallID(req.CallID)); err != nil {
		unavailable("%v", err)
		return
	}
	ctx = events.ExtractHop(ctx, m.Header)
	ctx, span := s.Tracer.Start(ctx, "preview_tool "+req.Name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(semconv.GenAIToolName(req.Name), semconv.GenAIToolCallID(req.CallID),
			attrRunID.String(req.RunID), attrToolVersion.String(req.Version)))
	defer span.End()
	log := s.Log.With("run_id", req.RunID, "call_id", req.CallID, "tool", req.Ref().String(), "preview", true)

	ref := req.Ref()
	entry, found, err := s.lookup(ctx, ref)
	switch {
	case err != nil:
		span.SetStatus(codes.Error, "registry unavailable")
		unavailable("the tool registry cannot be read")
		return
	case !found:
		unavailable("unknown tool %s", ref)
		return
	case !entry.Definition.SupportsPreview:
		unavailable("tool %s does not declare supports_preview", ref)
		return
	}
	def := &entry.Definition
	impl, te := s.toolFor(def)
	if te != nil {
		unavailable("%s", te.Message)
		return
	}
	pv, ok := impl.(toolapi.Previewer)
	if !ok {
		unavailable("tool %s has no dry run in this executor", ref)
		return
	}
	schemas, err := s.schemas.get(def)
	if err != nil {
		unavailable("tool %s has an invalid JSON Schema in the registry", ref)
		return
	}
	if err := envelope.ValidateAgainst(ref.String()+" input", schemas.Input, req.Input); err != nil {
		unavailable("the arguments do not match the input schema of %s", ref)
		return
	}
	sec, err := s.resolveSecrets(ctx, &req, def, log)
	if err != nil {
		unavailable("the tool's secrets cannot be read now")
		return
	}
	if sec.err != nil {
		unavailable("%s", sec.err.Message)
		return
	}
	log = sec.logger(log)

	tctx, cancel := context.WithTimeoutCause(ctx, def.Timeout(), errToolTimeout)
	defer cancel()
	tc := toolapi.Context{TenantID: req.Tenant.ID(), RunID: req.RunID, CallID: req.CallID, Auth: sec.authMap(), SecretDestinations: def.SecretDestinations, Log: log}
	out, perr := func() (out json.RawMessage, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("tool preview panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				out, err = nil, envelope.NewToolError(envelope.CodeUnknown, "internal error in the dry run of %s", ref)
			}
		}()
		return pv.Preview(tctx, req.Input, tc)
	}()
	var te2 *envelope.ToolError
	if perr != nil {
		// As for a call (invoke): a dry run that fails once its time is up
		// timed out, whatever it failed with.
		deadline, _ := tctx.Deadline()
		if errors.Is(context.Cause(tctx), errToolTimeout) || !time.Now().Before(deadline) {
			log.Debug("tool preview failed after its time limit", "err", perr)
			perr = envelope.NewToolError(envelope.CodeTimeout, "the dry run of %s timed out after %s", ref, def.Timeout())
		}
		if !errors.As(perr, &te2) {
			log.Error("tool preview failed", "err", perr)
			te2 = envelope.NewToolError(envelope.CodeUnknown, "internal error in the dry run of %s", ref)
		}
	}
	out, te2 = sec.scrubResult(out, te2)
	if te2 != nil {
		span.SetStatus(codes.Error, te2.Message)
		unavailable("the dry run failed: %s", te2.Message)
		return
	}
	if len(out) == 0 || !json.Valid(out) {
		unavailable("the dry run of %s returned no JSON", ref)
		return
	}
	reply(events.ApprovalPreview{Output: out})
}
