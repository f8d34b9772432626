package policy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/kvwatch"
	"github.com/toolwire/toolwire/pkg/rules"
)

// Approvals (see doc.go). A call that needs approval is held in the KV bucket
// events.BucketApprovals: the record is created pending (compare-and-set on
// absence), moved to exactly one final state by compare-and-set on its
// revision (a decision, or its deadline), and only then is the outcome event
// published, from the record; Settled marks the outcome as stored. Whatever
// crashes, a redelivery or the sweeper publishes what the record says, and
// the outcome's deterministic event id drops duplicates. No goroutine waits
// for a decision: a watch keeps each replica's view of the deadlines, and a
// sweeper expires the due ones.

// Consumer of the operators' decisions.
const (
	DurableDecisions = "policy-decisions"
)

// Span names and attributes of approvals.
const (
	SpanDecideApproval = "policy decide_approval"
	SpanExpireApproval = "policy expire_approval"

	AttrApprovalRequired = "toolwire.policy.approval_required"
	AttrDecision         = "toolwire.policy.decision"
	AttrApprovalState    = "toolwire.policy.approval_state"
)

// Approval outcomes, the "outcome" label of the approvals metric besides the
// final states.
const (
	approvalRequested = "requested"
	approvalIgnored   = "ignored"
)

// maxPreviewBytes bounds a preview kept in an approval request.
const maxPreviewBytes = 64 << 10

// settleGrace is how long a decided record may stay unsettled before the
// sweeper publishes its outcome (the deciding handler normally does at once).
const settleGrace = 5 * time.Second

// requestApproval holds an allowed call for an operator's decision, for at
// most timeout: it stores the pending record and publishes
// approval_required. A call held already (its turn handled again) publishes
// what the existing record implies, and keeps its deadline.
func (s *Service) requestApproval(ctx context.Context, req *events.CallRequest, def envelope.ToolDefinition, reason string, timeout time.Duration, rt events.RunTrace) error {
	key, err := events.ApprovalKey(req.RunID, req.CallID)
	if err != nil {
		return consume.Permanent(err)
	}
	for range 3 {
		if held, err := s.followApproval(ctx, req); err != nil || held {
			return err
		}
		now := time.Now().UTC()
		deadline := now.Add(timeout)
		ar := events.ApprovalRequest{
			RunID: req.RunID, CorrelationID: req.CallID, ToolName: req.Name, ToolVersion: req.Version,
			AgentName: req.Agent, Tenant: req.Tenant, ArgsSummary: SummarizeArgsWith(req.Input, s.piiFor(req.Tenant.OrgID)),
			EffectDescription: describeEffect(&def), Reason: reason, ExpiresAt: deadline,
		}
		if g := req.Gate; g != nil && g.Gate != envelope.GateAuto {
			ar.Gate = g
		}
		if def.SupportsPreview {
			ar.Preview = s.preview(ctx, req)
		}
		rec := events.ApprovalRecord{State: events.ApprovalPending, Call: *req, Request: ar,
			RequestedAt: now, Deadline: deadline, Trace: rt}
		b, err := json.Marshal(rec)
		if err != nil {
			return consume.Permanent(fmt.Errorf("approval %s: %w", key, err))
		}
		if _, err := s.approvals.Create(ctx, key, b); err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // another replica stored it first: follow its record
			}
			return fmt.Errorf("store approval %s: %w", key, err)
		}
		if err := s.publishApprovalRequired(ctx, &rec); err != nil {
			return err
		}
		s.metrics.approvals.WithLabelValues(approvalRequested).Inc()
		s.Log.InfoContext(ctx, "tool call awaits approval", "run_id", req.RunID, "call_id", req.CallID,
			"tool", calledTool(req), "reason", reason, "deadline", deadline)
		return nil
	}
	return fmt.Errorf("approval %s: the record kept changing", key)
}

// followApproval reports whether the call has an approval record, and then
// publishes what the record implies: the approval request again while it is
// pending, the outcome of a decided record not yet settled, nothing once it
// is settled.
func (s *Service) followApproval(ctx context.Context, req *events.CallRequest) (bool, error) {
	key, err := events.ApprovalKey(req.RunID, req.CallID)
	if err != nil {
		return false, consume.Permanent(err)
	}
	cur, err := s.approvals.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read approval %s: %w", key, err)
	}
	rec, err := events.DecodeApprovalRecord(cur.Value())
	if err != nil {
		return true, consume.Permanent(fmt.Errorf("approval %s: %w", key, err))
	}
	if rec.Pending() {
		return true, s.publishApprovalRequired(ctx, &rec)
	}
	return true, s.settle(ctx, key, rec, cur.Revision())
}

func (s *Service) publishApprovalRequired(ctx context.Context, rec *events.ApprovalRecord) error {
	out, err := events.NewApprovalRequired(s.cfg.Source, rec.Request, rec.Trace)
	if err != nil {
		return consume.Permanent(fmt.Errorf("approval request: %w", err))
	}
	return s.Pub.Publish(ctx, out)
}

// describeEffect is what an approval request says the call will change.
func describeEffect(def *envelope.ToolDefinition) string {
	what := strings.TrimSpace(def.Description)
	if what != "" && !strings.HasSuffix(what, ".") {
		what += "."
	}
	var effect string
	switch def.Metadata.SideEffects {
	case envelope.SideEffectsWrites:
		effect = "It writes: it changes external state, and runs at most once for this call."
	case envelope.SideEffectsReads:
		effect = "It reads external data and changes nothing."
	case envelope.SideEffectsNone:
		effect = "It has no side effects."
	default:
		effect = fmt.Sprintf("Its side effects (%q) are unknown.", def.Metadata.SideEffects)
	}
	return strings.TrimSpace(fmt.Sprintf("Calls %s. %s %s", def.Ref(), what, effect))
}

// preview asks an executor for the call's dry run. It never fails the
// approval: without a preview, the request says why.
func (s *Service) preview(ctx context.Context, req *events.CallRequest) *events.ApprovalPreview {
	b, err := json.Marshal(req)
	if err != nil {
		return &events.ApprovalPreview{Unavailable: "the call cannot be sent for a preview"}
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PreviewTimeout)
	defer cancel()
	m := nats.NewMsg(events.SubjectPreview)
	m.Data = b
	events.InjectHop(pctx, m.Header)
	resp, err := s.JS.Conn().RequestMsgWithContext(pctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return &events.ApprovalPreview{Unavailable: "preview unavailable: no executor answers preview requests"}
	case err != nil:
		s.Log.WarnContext(ctx, "preview request failed", "run_id", req.RunID, "call_id", req.CallID, "err", err)
		return &events.ApprovalPreview{Unavailable: fmt.Sprintf("preview unavailable: no answer within %s", s.cfg.PreviewTimeout)}
	}
	if len(resp.Data) > maxPreviewBytes {
		return &events.ApprovalPreview{Unavailable: fmt.Sprintf("preview unavailable: it is %d bytes, more than %d", len(resp.Data), maxPreviewBytes)}
	}
	var p events.ApprovalPreview
	if err := json.Unmarshal(resp.Data, &p); err != nil || (len(p.Output) == 0 && p.Unavailable == "") {
		return &events.ApprovalPreview{Unavailable: "preview unavailable: the executor's answer was malformed"}
	}
	return &p
}

// handleDecision applies an operator's decision to a pending call. A decision
// for a call that awaits none (unknown, already decided, expired) is logged
// and dropped.
func (s *Service) handleDecision(ctx context.Context, d *consume.Delivery) error {
	var dec events.Decision
	if err := events.DecodeData(d.Event, &dec); err != nil {
		return consume.Permanent(fmt.Errorf("decision: %w", err))
	}
	if err := matchSubject(d.Subject, dec.RunID, dec.CallID, 0); err != nil {
		return consume.Permanent(fmt.Errorf("decision: %w", err))
	}
	if err := dec.Validate(); err != nil {
		return consume.Permanent(err)
	}
	key, err := events.ApprovalKey(dec.RunID, dec.CallID)
	if err != nil {
		return consume.Permanent(err)
	}
	ctx, span := s.startSpan(ctx, SpanDecideApproval, events.TraceOf(d.Event),
		attribute.String(AttrRunID, dec.RunID), attribute.String(AttrToolCallID, dec.CallID),
		attribute.String(AttrDecision, string(dec.Decision)))
	defer span.End()

	for range 5 {
		e, err := s.approvals.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			s.ignoreDecision(ctx, span, &dec, "no call of that run awaits approval")
			return nil
		}
		if err != nil {
			return fail(span, fmt.Errorf("read approval %s: %w", key, err))
		}
		rec, err := events.DecodeApprovalRecord(e.Value())
		if err != nil {
			return fail(span, consume.Permanent(fmt.Errorf("approval %s: %w", key, err)))
		}
		if !rec.Pending() {
			if !rec.Settled && sameDecision(rec.Decision, &dec) {
				return s.settle(ctx, key, rec, e.Revision()) // this decision's redelivery
			}
			s.ignoreDecision(ctx, span, &dec, "the call was already "+describeState(&rec))
			return nil
		}
		now := time.Now().UTC()
		late := !now.Before(rec.Deadline)
		if late {
			rec.State = events.ApprovalExpired
		} else {
			rec.State, rec.Decision = decidedState(dec.Decision), &dec
		}
		rec.DecidedAt = &now
		rev, err := s.update(ctx, key, &rec, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // decided or expired meanwhile: look again
		}
		if err != nil {
			return fail(span, err)
		}
		span.SetAttributes(attribute.String(AttrApprovalState, string(rec.State)))
		s.metrics.approvals.WithLabelValues(string(rec.State)).Inc()
		if late {
			s.ignoreDecision(ctx, span, &dec, "it came after the deadline "+rec.Deadline.Format(time.RFC3339))
		} else {
			s.Log.InfoContext(ctx, "approval decided", "run_id", dec.RunID, "call_id", dec.CallID,
				"decision", dec.Decision, "by", dec.By)
		}
		return s.settle(ctx, key, rec, rev)
	}
	return fail(span, fmt.Errorf("decision for %s: the record kept changing", key))
}

func (s *Service) ignoreDecision(ctx context.Context, span trace.Span, dec *events.Decision, why string) {
	s.metrics.approvals.WithLabelValues(approvalIgnored).Inc()
	span.AddEvent("decision ignored", trace.WithAttributes(attribute.String(AttrReason, why)))
	s.Log.WarnContext(ctx, "decision ignored: "+why, "run_id", dec.RunID, "call_id", dec.CallID,
		"decision", dec.Decision, "by", dec.By)
}

func describeState(rec *events.ApprovalRecord) string {
	if rec.State == events.ApprovalExpired {
		return "denied: its approval timed out"
	}
	if rec.State == events.ApprovalWithdrawn {
		return "withdrawn: the run was " + cmp.Or(rec.Withdrawn, "cancelled")
	}
	if rec.Decision != nil && rec.Decision.By != "" {
		return string(rec.State) + " by " + rec.Decision.By
	}
	return string(rec.State)
}

func sameDecision(a, b *events.Decision) bool {
	return a != nil && b != nil && *a == *b
}

func decidedState(k events.DecisionKind) events.ApprovalState {
	switch k {
	case events.DecisionApprove:
		return events.ApprovalApproved
	case events.DecisionRevise:
		return events.ApprovalRevised
	}
	return events.ApprovalDenied
}

// update writes rec if the key is still at revision rev.
func (s *Service) update(ctx context.Context, key string, rec *events.ApprovalRecord, rev uint64) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, consume.Permanent(fmt.Errorf("approval %s: %w", key, err))
	}
	n, err := s.approvals.Update(ctx, key, b, rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("approval %s: %w", key, jetstream.ErrKeyRevisionMismatch)
		}
		return 0, fmt.Errorf("update approval %s: %w", key, err)
	}
	return n, nil
}

// settle publishes the outcome of a decided or expired record, then marks it
// settled. Publishing again is harmless: the outcome's event id is
// deterministic.
func (s *Service) settle(ctx context.Context, key string, rec events.ApprovalRecord, rev uint64) error {
	if rec.Settled || rec.Pending() {
		return nil
	}
	if over, err := s.callOver(ctx, &rec.Call); err != nil {
		return err
	} else if over != "" {
		// Nothing of a run follows its end (runover.go): the record is
		// settled without an outcome.
		rec.Settled = true
		if _, err := s.update(ctx, key, &rec, rev); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
		s.metrics.runOver.WithLabelValues("approval", over).Inc()
		s.Log.WarnContext(ctx, "approval of a call of a run that is over settled without an outcome", "key", key,
			"state", rec.State, "reason", over)
		return nil
	}
	if rec.State == events.ApprovalApproved && !rec.Routed {
		var err error
		if rec, rev, err = s.routeApproved(ctx, key, rec, rev); err != nil || rec.Settled {
			return err
		}
	}
	out, err := s.outcome(&rec)
	if err != nil {
		return consume.Permanent(fmt.Errorf("approval %s outcome: %w", key, err))
	}
	if err := s.Pub.Publish(ctx, out); err != nil {
		return err
	}
	rec.Settled = true
	if _, err := s.update(ctx, key, &rec, rev); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// The outcome is stored; the sweeper will mark the record later.
		s.Log.WarnContext(ctx, "approval outcome published but not marked settled", "key", key, "err", err)
	}
	return nil
}

// Messages of the POLICY_DENIED envelopes that settle an approval; the
// envelope's details say which ({"approval": "deny" | "revise" | "timeout"}).
const (
	MsgApprovalDenied   = "approval denied"
	MsgRevisionAsked    = "revision requested"
	MsgApprovalTimedOut = "approval timed out"
)

// outcome is the event that settles a record: the call approved to its
// queue, or its POLICY_DENIED completion.
func (s *Service) outcome(rec *events.ApprovalRecord) (events.Outgoing, error) {
	if rec.State == events.ApprovalApproved && rec.Unserved != "" {
		env := UnservedEnvelope(&rec.Call, rec.Unserved, s.cfg.QueueWait, derefTime(rec.DecidedAt))
		// The approval was applied, as a denial's is: its details say so,
		// for whoever audits the call (the recorder's timeline).
		if details, ok := env.Error.Details.(map[string]any); ok {
			details["approval"] = "approve"
			if rec.Decision != nil && rec.Decision.By != "" {
				details["by"] = rec.Decision.By
			}
		}
		return events.NewCallCompleted(s.cfg.Source, rec.Call.RunID, env, rec.Call.Tenant, rec.Trace)
	}
	if rec.State == events.ApprovalApproved {
		call := rec.Call
		call.OperatorApproved = true
		call.Queue = cmp.Or(call.Queue, envelope.DefaultQueue)
		return events.NewCallApproved(s.cfg.Source, call, rec.Trace)
	}
	at := time.Now().UTC()
	if rec.DecidedAt != nil {
		at = *rec.DecidedAt
	}
	if rec.State == events.ApprovalWithdrawn {
		env := DeniedEnvelope(&rec.Call, rules.Deny("withdrawn"), at)
		env.Error = events.CancelledCallError(false, cmp.Or(rec.Withdrawn, "cancelled"))
		return events.NewCallCompleted(s.cfg.Source, rec.Call.RunID, env, rec.Call.Tenant, rec.Trace)
	}
	env := ApprovalDeniedEnvelope(rec, at)
	return events.NewCallCompleted(s.cfg.Source, rec.Call.RunID, env, rec.Call.Tenant, rec.Trace)
}

// ApprovalDeniedEnvelope is the receipt of a call whose approval was denied,
// revised or timed out: POLICY_DENIED, with a message the model can act on
// and details for programs:
//
//	deny:    "approval denied[ by BY][: NOTE]"          {"approval": "deny", "by": BY, "note": NOTE}
//	revise:  "revision requested[ by BY]: NOTE"          {"approval": "revise", "by": BY, "note": NOTE}
//	timeout: "approval timed out: no decision within D"  {"approval": "timeout", "deadline": RFC 3339}
//
// D is the time the operator had (the record's Deadline less its
// RequestedAt); a record that does not say when the call was held names its
// deadline instead: "approval timed out: no decision by DEADLINE".
func ApprovalDeniedEnvelope(rec *events.ApprovalRecord, at time.Time) envelope.ToolEnvelope {
	var msg string
	details := map[string]any{}
	by, note := "", ""
	if rec.Decision != nil {
		by, note = rec.Decision.By, strings.TrimSpace(rec.Decision.Note)
	}
	switch rec.State {
	case events.ApprovalRevised:
		msg, details["approval"] = MsgRevisionAsked, "revise"
	case events.ApprovalExpired:
		if rec.RequestedAt.IsZero() {
			msg = fmt.Sprintf("%s: no decision by %s", MsgApprovalTimedOut, rec.Deadline.UTC().Format(time.RFC3339))
		} else {
			msg = fmt.Sprintf("%s: no decision within %s", MsgApprovalTimedOut, rec.Deadline.Sub(rec.RequestedAt))
		}
		details["approval"], details["deadline"] = "timeout", rec.Deadline.UTC().Format(time.RFC3339Nano)
		by, note = "", ""
	default:
		msg, details["approval"] = MsgApprovalDenied, "deny"
	}
	if by != "" {
		msg += " by " + by
		details["by"] = by
	}
	if note != "" {
		msg += ": " + note
		details["note"] = note
	}
	env := DeniedEnvelope(&rec.Call, rules.Deny("%s", msg), at)
	env.Error.Details = details
	return env
}

// pendingIndex is a replica's view of the approval deadlines, kept by a KV
// watch: which records are pending (due at their deadline) or decided but
// not yet settled (due after a grace period). It only says where to look;
// every change is made on the record by compare-and-set.
type pendingIndex struct {
	mu    sync.Mutex
	due   map[string]time.Time
	watch *kvwatch.KVWatch
}

// watchApprovals starts the index; ctx bounds the wait for the records there
// are, and the index follows the bucket until stop.
func watchApprovals(ctx context.Context, kv jetstream.KeyValue) (*pendingIndex, error) {
	p := &pendingIndex{due: map[string]time.Time{}}
	w, err := kvwatch.WatchKV(ctx, kv, true, p.apply)
	if err != nil {
		return nil, err
	}
	p.watch = w
	return p, nil
}

func (p *pendingIndex) apply(e jetstream.KeyValueEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.due, e.Key())
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	rec, err := events.DecodeApprovalRecord(e.Value())
	if err != nil {
		return
	}
	switch {
	case rec.Pending():
		p.due[e.Key()] = rec.Deadline
	case !rec.Settled:
		at := time.Now()
		if rec.DecidedAt != nil {
			at = *rec.DecidedAt
		}
		p.due[e.Key()] = at.Add(settleGrace)
	}
}

// dueKeys returns the keys due at now.
func (p *pendingIndex) dueKeys(now time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k, t := range p.due {
		if !now.Before(t) {
			out = append(out, k)
		}
	}
	return out
}

func (p *pendingIndex) stop() { p.watch.Stop() }

// sweep expires the pending approvals past their deadline and settles the
// decided ones left unsettled. It runs on a ticker in every replica; the
// compare-and-set on each record makes one replica win.
func (s *Service) sweep(ctx context.Context, now time.Time) {
	for _, key := range s.index.dueKeys(now) {
		if err := s.expire(ctx, key, now); err != nil && ctx.Err() == nil {
			s.Log.WarnContext(ctx, "approval sweep", "key", key, "err", err)
		}
	}
}

func (s *Service) expire(ctx context.Context, key string, now time.Time) error {
	e, err := s.approvals.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read approval %s: %w", key, err)
	}
	rec, err := events.DecodeApprovalRecord(e.Value())
	if err != nil {
		return err
	}
	switch {
	case rec.Pending() && !now.Before(rec.Deadline):
		ctx, span := s.startSpan(ctx, SpanExpireApproval, rec.Trace,
			attribute.String(AttrRunID, rec.Call.RunID), attribute.String(AttrToolCallID, rec.Call.CallID))
		defer span.End()
		at := now.UTC()
		rec.State, rec.DecidedAt = events.ApprovalExpired, &at
		rev, err := s.update(ctx, key, &rec, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil // decided, or expired by another replica, meanwhile
		}
		if err != nil {
			return fail(span, err)
		}
		s.metrics.approvals.WithLabelValues(string(events.ApprovalExpired)).Inc()
		s.Log.InfoContext(ctx, "approval timed out: the call is denied", "run_id", rec.Call.RunID,
			"call_id", rec.Call.CallID, "deadline", rec.Deadline)
		return s.settle(ctx, key, rec, rev)
	case !rec.Pending() && !rec.Settled:
		return s.settle(ctx, key, rec, e.Revision())
	}
	return nil
}

// sweepLoop runs sweep every ApprovalSweep until ctx ends.
func (s *Service) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ApprovalSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sweep(ctx, now)
		}
	}
}
