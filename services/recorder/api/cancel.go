package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// writeTimeout bounds the NATS work of a cancel or a decision.
const writeTimeout = 10 * time.Second

// cancelRun is POST /v1/runs/{run_id}/cancel: the run's cancel request,
// published as `toolwire cancel` does, for a producer, approver or admin of
// the run's tenant. A run that has ended is answered with its end; asking
// again is harmless (the request's id is one per run: the stream drops a
// repeat, the orchestrator ignores a cancel of a run that is ending).
func (a *api) cancelRun(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	p := auth.FromContext(r.Context())
	if e := may(p, auth.RoleProducer, "cancelling a run"); e != nil {
		e.write(w)
		return
	}
	body, e := readBody(w, r, true)
	if e != nil {
		e.write(w)
		return
	}
	var in apitypes.CancelRequestJSON
	if body != nil {
		if e := decodeStrict(body, &in); e != nil {
			e.write(w)
			return
		}
	}
	if store.IsTerminal(run.Status) {
		writeJSON(w, http.StatusOK, apitypes.CancelJSON{RunID: run.RunID, Status: run.Status, Cancelled: false})
		return
	}
	if a.opts.JS == nil {
		unavailable("this recorder has no NATS connection to publish the cancel request on; use toolwire cancel").write(w)
		return
	}
	err := Cancel(r.Context(), a.pub, run, p.Name, in.Reason)
	var invalidCancel *invalidCancelError
	switch {
	case errors.As(err, &invalidCancel):
		invalid("the cancel request is not valid", problems(invalidCancel.err)...).write(w)
		return
	case err != nil:
		if r.Context().Err() != nil {
			return
		}
		unavailable(fmt.Sprintf("the cancel request could not be published now (%v); retry", err)).write(w)
		return
	}
	a.log.Info("api: run cancel requested", "run_id", run.RunID, "by", p.Name)
	writeJSON(w, http.StatusAccepted, apitypes.CancelJSON{RunID: run.RunID, Status: apitypes.StatusCancelling, Cancelled: true})
}

// Cancel publishes run's cancel request (events.NewCancelRequested), asked
// by by (a principal's name) for the run's own tenant, as `toolwire cancel`
// does: what POST /v1/runs/{run_id}/cancel and the timeline's Cancel button
// publish. The request's id is one per run, so publishing it again within
// the stream's duplicate window stores nothing more. A request that is not
// valid (a reason too long) is an error wrapping events.ErrInvalidCancel.
func Cancel(ctx context.Context, pub *publish.Publisher, run store.Run, by, reason string) error {
	c := events.CancelRequest{RunID: run.RunID, Reason: strings.TrimSpace(reason), By: by, Tenant: run.Tenant,
		RequestedAt: time.Now().UTC()}
	if err := c.Validate(); err != nil {
		return &invalidCancelError{err}
	}
	out, err := events.NewCancelRequested(source, c, events.RunTraceFrom(ctx))
	if err != nil {
		return &invalidCancelError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return pub.Publish(ctx, out)
}

// invalidCancelError is a cancel request Cancel refused to build.
type invalidCancelError struct{ err error }

func (e *invalidCancelError) Error() string { return e.err.Error() }
func (e *invalidCancelError) Unwrap() error { return e.err }

// shortCallID is a call id as the decision route takes it: the whole id or
// at least approvals.MinShortCallIDLen of its leading digits.
var shortCallID = regexp.MustCompile(`^[0-9a-f]{6,64}$`)

// decideCall is POST /v1/runs/{run_id}/calls/{call_id}/decision: an
// approver's decision on a call that awaits approval, read and published
// through pkg/jetstream/approvals exactly as `toolwire approve|deny|revise`
// and the timeline's buttons do.
func (a *api) decideCall(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	callID := strings.ToLower(r.PathValue("call_id"))
	if !shortCallID.MatchString(callID) {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidCallID,
			fmt.Sprintf("call_id %q is not a call id: hex, at least %d digits", clip(callID), approvals.MinShortCallIDLen))
		return
	}
	p := auth.FromContext(r.Context())
	if e := may(p, auth.RoleApprover, "deciding an approval"); e != nil {
		e.write(w)
		return
	}
	body, e := readBody(w, r, false)
	if e != nil {
		e.write(w)
		return
	}
	var in apitypes.DecisionRequestJSON
	if e := decodeStrict(body, &in); e != nil {
		e.write(w)
		return
	}
	if a.opts.JS == nil {
		unavailable("this recorder has no NATS connection to publish decisions on; use toolwire approve").write(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), writeTimeout)
	defer cancel()
	full, err := approvals.ResolveCallID(ctx, a.opts.JS, run.RunID, callID)
	if err == nil {
		callID = full
	}
	d := events.Decision{RunID: run.RunID, CallID: callID, Decision: events.DecisionKind(in.Decision),
		Note: strings.TrimSpace(in.Note), By: p.Name}
	if err == nil {
		if verr := d.Validate(); verr != nil {
			invalid("the decision is not valid", problems(verr)...).write(w)
			return
		}
		var rec events.ApprovalRecord
		rec, err = approvals.PendingApproval(ctx, a.opts.JS, run.RunID, callID)
		if err == nil && !p.Sees(rec.Call.Tenant) {
			err = fmt.Errorf("%w: call %s of run %s", approvals.ErrNoApproval, callID, run.RunID)
		}
		if err == nil {
			// Still pending in the guard's record, but the run's
			// cancellation may have answered the call already.
			if why := a.withdrawn(ctx, run, callID); why != "" {
				err = fmt.Errorf("%w: call %s of run %s no longer awaits a decision: its approval was withdrawn (%s)",
					approvals.ErrAlreadyDecided, callID, run.RunID, why)
			}
		}
		if err == nil {
			err = approvals.PublishDecision(ctx, a.opts.JS, source, d, rec)
		}
	}
	switch {
	case errors.Is(err, approvals.ErrNoApproval):
		writeError(w, http.StatusNotFound, apitypes.CodeCallNotFound,
			fmt.Sprintf("no call %s of run %s awaits or awaited approval", callID, run.RunID))
	case errors.Is(err, approvals.ErrAmbiguousCall):
		writeError(w, http.StatusConflict, apitypes.CodeAmbiguousCallID, err.Error())
	case errors.Is(err, approvals.ErrAlreadyDecided):
		writeError(w, http.StatusConflict, apitypes.CodeAlreadyDecided, err.Error())
	case err != nil:
		if r.Context().Err() != nil {
			return
		}
		a.log.Error("api: decide", "run_id", run.RunID, "call_id", callID, "err", err)
		unavailable("the decision could not be published now; retry, or use toolwire approve").write(w)
	default:
		a.log.Info("api: approval decided", "run_id", run.RunID, "call_id", callID, "decision", d.Decision, "by", p.Name)
		writeJSON(w, http.StatusAccepted, apitypes.DecidedJSON{RunID: run.RunID, CallID: callID, Decision: string(d.Decision)})
	}
}

// withdrawn says why a call's approval was withdrawn by its run's
// cancellation ("" when it was not): the run was cancelled, or the call's
// envelope says the cancellation kept it from running.
func (a *api) withdrawn(ctx context.Context, run store.Run, callID string) string {
	if run.Status == events.StatusCancelled {
		return "the run was cancelled"
	}
	c, err := a.store.ToolCall(ctx, run.RunID, callID)
	if err != nil || len(c.Envelope) == 0 {
		return ""
	}
	var env envelope.ToolEnvelope
	if json.Unmarshal(c.Envelope, &env) == nil && events.IsCancelledCall(env.Error) {
		return env.Error.Message
	}
	return ""
}
