package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

// ErrNoRun is returned by Cancel for a run id that has no request.
var ErrNoRun = errors.New("no such run")

// Cancelled is the answer to a cancel: Cancelled is true when the cancel
// request was published (the run is then "cancelling" until its end,
// which Wait returns); false when the run had ended already, with Status
// its end (completed, failed or cancelled).
type Cancelled struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	Cancelled bool   `json:"cancelled"`
}

// StatusCancelling is Cancelled.Status of a run asked to stop that has not
// ended yet.
const StatusCancelling = "cancelling"

// Cancel asks that a run stop (docs/agent-loop.md, Cancellation): it
// publishes the run's cancel request, toolwire.run.<run_id>.cancel_requested,
// for the run's tenant, unless the run has ended, which it then answers
// with. reason and by (who asks) go into the run's end. Cancelling again is
// harmless: a run is cancelled once. It needs credentials that may publish
// the cancel (an operator's, or a producer's trusted with every tenant); a
// producer limited to one tenant uses CancelOnIntake.
func (c *Client) Cancel(ctx context.Context, runID, reason, by string) (Cancelled, error) {
	if err := events.ValidateRunID(runID); err != nil {
		return Cancelled{}, err
	}
	if st, err := c.endOf(ctx, runID); err != nil || st != nil {
		if st == nil {
			return Cancelled{}, err
		}
		return Cancelled{RunID: runID, Status: st.Status}, nil
	}
	subj, err := events.RunSubject(runID, events.VerbRequested)
	if err != nil {
		return Cancelled{}, err
	}
	m, err := direct.Last(ctx, c.js, events.StreamRuns, subj)
	if errors.Is(err, direct.ErrNotStored) {
		return Cancelled{}, fmt.Errorf("%w: %s", ErrNoRun, runID)
	}
	if err != nil {
		return Cancelled{}, fmt.Errorf("cancel %s: read its request: %w", runID, err)
	}
	ev, err := events.Decode(natsMsg(m))
	if err != nil {
		return Cancelled{}, fmt.Errorf("cancel %s: its request: %w", runID, err)
	}
	var req envelope.RunRequest
	if err := events.DecodeData(ev, &req); err != nil {
		return Cancelled{}, fmt.Errorf("cancel %s: its request: %w", runID, err)
	}
	out, err := events.NewCancelRequested(c.source, events.CancelRequest{RunID: runID, Reason: reason, By: by,
		Tenant: req.Tenant, RequestedAt: time.Now().UTC()}, events.RunTraceFrom(ctx))
	if err != nil {
		return Cancelled{}, err
	}
	if err := c.pub.Publish(ctx, out); err != nil {
		return Cancelled{}, fmt.Errorf("cancel %s: %w", runID, err)
	}
	return Cancelled{RunID: runID, Status: StatusCancelling, Cancelled: true}, nil
}

// CancelOnIntake hands a cancel of the run in on its tenant's intake
// subject, as a producer limited to that tenant must (see SubmitToIntake):
// the orchestrator passes it on as the run's cancel request once it has
// checked that the run is the tenant's, and refuses it otherwise. Such a
// producer cannot read the streams: it learns the run's end from the
// recorder's API.
func (c *Client) CancelOnIntake(ctx context.Context, tenant envelope.Tenant, runID, reason, by string) error {
	out, err := events.NewCancelRequested(c.source, events.CancelRequest{RunID: runID, Reason: reason, By: by,
		Tenant: tenant, RequestedAt: time.Now().UTC()}, events.RunTraceFrom(ctx))
	if err != nil {
		return err
	}
	if out.Subject, err = events.IntakeSubject(tenant, runID); err != nil {
		return err
	}
	nonce, err := intakeNonce()
	if err != nil {
		return err
	}
	out.MsgID = out.Subject + "/cancel/" + nonce
	return c.pub.Publish(ctx, out)
}

// endOf is the run's end as the runs stream's leader has it, nil when the
// run has not ended.
func (c *Client) endOf(ctx context.Context, runID string) (*events.RunStatus, error) {
	m, err := direct.RunEnd(ctx, c.js, runID)
	if err != nil || m == nil {
		return nil, err
	}
	ev, err := events.Decode(natsMsg(m))
	if err != nil {
		return nil, fmt.Errorf("run %s: its end: %w", runID, err)
	}
	var st events.RunStatus
	if err := events.DecodeData(ev, &st); err != nil {
		return nil, fmt.Errorf("run %s: its end: %w", runID, err)
	}
	return &st, nil
}

// natsMsg is m as events.Decode reads it.
func natsMsg(m *direct.Msg) *nats.Msg {
	return &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}
}
