package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// DurableIntake is the orchestrator's consumer of the intake stream: the
// run requests of producers limited to one tenant (events/intake.go).
const DurableIntake = "orchestrator-intake"

// intakeSpec is the consumer of the intake.
func (s *Service) intakeSpec() consume.RunnerConfig {
	return consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamIntake, Durable: DurableIntake,
			Filters: []string{events.SubjectsIntake}, MaxAckPending: 1024, AckWait: s.cfg.shortAckWait()},
		Handler: s.handleIntake, Undecodable: s.undecodableRequest,
	}
}

// handleIntake hands a tenant's run request over to the runs stream, as the
// run's request, when it is the intake subject's tenant's and the run id is
// not another tenant's run; what is refused is dead-lettered with the
// reason (the producer that sent it may have been limited to one tenant
// for that very reason), and no run is made of it.
func (s *Service) handleIntake(ctx context.Context, d *consume.Delivery) error {
	in, err := events.ParseIntakeSubject(d.Subject)
	if err != nil {
		return consume.Permanent(fmt.Errorf("orchestrator: intake: %w", err))
	}
	refuse := func(err error) error {
		s.Log.Warn("intake refused", "subject", d.Subject, "run_id", in.RunID, "err", err)
		return consume.Permanent(fmt.Errorf("orchestrator: intake %s refused: %w", d.Subject, err))
	}
	switch d.Event.Type() {
	case events.TypeRunRequested:
	case events.TypeRunCancelRequested:
		return s.intakeCancel(ctx, d, in, refuse)
	default:
		return refuse(fmt.Errorf("event type %q: the intake takes %s and %s only", d.Event.Type(),
			events.TypeRunRequested, events.TypeRunCancelRequested))
	}
	var req envelope.RunRequest
	if err := events.DecodeData(d.Event, &req); err != nil {
		return refuse(err)
	}
	if err := in.Check(req); err != nil {
		return refuse(err)
	}
	subj, err := events.RunSubject(in.RunID, events.VerbRequested)
	if err != nil {
		return refuse(err)
	}
	// The run id may be taken: by this request, handed over before (a
	// redelivery), or by another tenant's run, which this request must not
	// join. settled is whether the handler is done, with its result.
	settled := func() (bool, error) {
		owner, err := s.requestTenant(ctx, subj)
		switch {
		case consume.IsPermanent(err):
			return true, refuse(err)
		case err != nil:
			return true, err
		case owner == nil:
			return false, nil
		case owner.OrgID != req.Tenant.OrgID || owner.WorkspaceID != req.Tenant.WorkspaceID:
			return true, refuse(fmt.Errorf("%w: run %s is another tenant's", events.ErrIntakeTenant, in.RunID))
		}
		return true, nil // handed over already
	}
	if done, err := settled(); done {
		return err
	}
	// The request's id is the run's, whatever its producer called it: the
	// id is the Nats-Msg-Id the runs stream dedupes on and the key the
	// recorder stores it by, and a producer's choice there could be one of
	// another run's events (its request, a turn, an envelope), which would
	// then be dropped as this one's duplicate.
	e := d.Event.Clone()
	e.SetID(events.RunRequestedID(in.RunID))
	m, err := events.Encode(subj, &e)
	if err != nil {
		return refuse(err)
	}
	events.InjectHop(ctx, m.Header)
	// Only if the run has no request yet: two tenants handing in one run id
	// at once get one run, whose tenant the other learns below.
	ack, err := s.JS.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil && !ack.Duplicate:
		return nil
	case err != nil && !publish.WrongLastSequence(err):
		return err
	}
	// Refused, or dropped as the duplicate of a request of this run stored
	// before: whose it is decides.
	if done, err := settled(); done {
		return err
	}
	if err == nil {
		// Another message of the runs stream had the request's id as its
		// Nats-Msg-Id (only a producer trusted with every tenant publishes
		// there with ids of its own): the request is not stored, and is
		// not until the stream's duplicate window has passed.
		return refuse(fmt.Errorf("the runs stream dropped it as the duplicate of another message under Nats-Msg-Id %s, which is not the run's request (replay this dead letter after the stream's duplicate window)",
			events.RunRequestedID(in.RunID)))
	}
	return fmt.Errorf("orchestrator: intake %s: the run's request was there and is gone", d.Subject)
}

// requestTenant is the tenant of the run request stored on subj; nil when
// there is none. A stored request that cannot be read is the run of
// nobody's tenant (a permanent error).
func (s *Service) requestTenant(ctx context.Context, subj string) (*envelope.Tenant, error) {
	e, err := last(ctx, s.history.runs, subj)
	switch {
	case errors.Is(err, errNotRecorded):
		return nil, nil
	case errors.Is(err, errUnreadable):
		return nil, consume.Permanent(fmt.Errorf("%w: %s holds an unreadable request: %w", events.ErrIntakeTenant, subj, err))
	case err != nil:
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	var req envelope.RunRequest
	if err := events.DecodeData(e.data, &req); err != nil {
		return nil, consume.Permanent(fmt.Errorf("%w: %s holds an unreadable request: %w", events.ErrIntakeTenant, subj, err))
	}
	return &req.Tenant, nil
}

// intakeCancel hands a tenant producer's cancel over to the runs stream, as
// the run's cancel request, when the run is the intake subject's tenant's;
// a cancel of no run, or of another tenant's, is refused (dead-lettered
// with the reason).
func (s *Service) intakeCancel(ctx context.Context, d *consume.Delivery, in events.IntakeOf, refuse func(error) error) error {
	var c events.CancelRequest
	if err := events.DecodeData(d.Event, &c); err != nil {
		return refuse(err)
	}
	if c.RunID != in.RunID {
		return refuse(fmt.Errorf("cancel of run %q on the intake subject of run %q", c.RunID, in.RunID))
	}
	subj, err := events.RunSubject(in.RunID, events.VerbRequested)
	if err != nil {
		return refuse(err)
	}
	owner, err := s.requestTenant(ctx, subj)
	switch {
	case consume.IsPermanent(err):
		return refuse(err)
	case err != nil:
		return err
	case owner == nil:
		return refuse(fmt.Errorf("no run %s", in.RunID))
	case owner.OrgID != in.Org || owner.WorkspaceID != in.Workspace:
		return refuse(fmt.Errorf("%w: run %s is another tenant's", events.ErrIntakeTenant, in.RunID))
	}
	// What the producer says of itself is kept as said; the tenant is the
	// run's, which the subject proved.
	c.Tenant = *owner
	if c.By == "" {
		c.By = "tenant " + owner.ID()
	}
	if c.RequestedAt.IsZero() {
		c.RequestedAt = d.Event.Time().UTC()
	}
	out, err := events.NewCancelRequested(s.cfg.Source, c, events.TraceOf(d.Event))
	if err != nil {
		return refuse(err)
	}
	return s.Pub.Publish(ctx, out)
}
