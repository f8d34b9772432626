package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// submitRun is POST /v1/runs: a run request handed in on its tenant's
// intake, as client.SubmitToIntake does, answered once the orchestrator has
// taken it over as the run's request.
//
// The run id is the idempotency key, and the runs stream, where the
// orchestrator stores the one request of each run, says what became of it.
// The orchestrator takes a same-tenant request under a run id that has one
// for a redelivery of it ("handed over already") and drops another tenant's:
// neither answers the submitter. So the answer is read back from the stored
// request: this request (equal as RFC 8785 canonical JSON, of this tenant)
// is 201 when this call's publication is the one stored, 200 when an earlier
// one is; anything else there is 409 run_id_in_use.
func (a *api) submitRun(w http.ResponseWriter, r *http.Request) {
	p := auth.FromContext(r.Context())
	if e := may(p, auth.RoleProducer, "submitting a run"); e != nil {
		e.write(w)
		return
	}
	body, e := readBody(w, r, false)
	if e != nil {
		e.write(w)
		return
	}
	req, e := a.runRequestOf(p, body)
	if e != nil {
		e.write(w)
		return
	}
	if a.opts.JS == nil {
		unavailable("this recorder has no NATS connection to hand the request in on; submit with the CLI or the Go client").write(w)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.opts.SubmitWait+5*time.Second)
	defer cancel()
	created, e := a.submit(ctx, req)
	if e != nil {
		if e.status == http.StatusInternalServerError && r.Context().Err() != nil {
			return // the client went away
		}
		e.write(w)
		return
	}
	status := store.StatusRequested
	if run, err := a.store.Run(ctx, req.RunID); err == nil {
		status = run.Status
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
		w.Header().Set("Location", "/v1/runs/"+url.PathEscape(req.RunID))
		a.log.Info("api: run submitted", "run_id", req.RunID, "tenant", req.Tenant.ID(), "by", p.Name)
	}
	writeJSON(w, code, apitypes.SubmitJSON{RunID: req.RunID, Status: status, Created: created})
}

// runRequestOf reads a submitted body as the run request of p's tenant:
// 400 for what is not JSON or has unknown fields, 403 tenant_mismatch for a
// body naming another tenant, 422 for what the schema, the request's own
// rules or the intake's subject refuse (every problem in details).
func (a *api) runRequestOf(p auth.Principal, body []byte) (envelope.RunRequest, *apiError) {
	var probe envelope.RunRequest
	typeErr := decodeStrict(body, &probe)
	if typeErr != nil && typeErr.status != http.StatusUnprocessableEntity {
		return envelope.RunRequest{}, typeErr
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil || doc == nil {
		return envelope.RunRequest{}, invalid("a run request is a JSON object", "at /: want an object")
	}
	if t, named := doc["tenant"]; !named || t == nil {
		if p.AllTenants() {
			return envelope.RunRequest{}, invalid("tenant is required: this credential is for every tenant, so the request must name one",
				"at /tenant: required for a credential of every tenant")
		}
		tenant := map[string]any{"org_id": p.OrgID}
		if p.WorkspaceID != "" {
			tenant["workspace_id"] = p.WorkspaceID
		}
		doc["tenant"] = tenant
	} else if !p.AllTenants() {
		var named envelope.Tenant
		b, _ := json.Marshal(t)
		if json.Unmarshal(b, &named) == nil && (named.OrgID != p.OrgID || (p.WorkspaceID != "" && named.WorkspaceID != p.WorkspaceID)) {
			mine := p.OrgID
			if p.WorkspaceID != "" {
				mine += "/" + p.WorkspaceID
			}
			return envelope.RunRequest{}, &apiError{status: http.StatusForbidden, code: apitypes.CodeTenantMismatch,
				msg: fmt.Sprintf("the request names tenant %s/%s; this credential submits for %s only (omit tenant to use it)",
					named.OrgID, named.WorkspaceID, mine)}
		}
	}
	filled, err := json.Marshal(doc)
	if err != nil {
		return envelope.RunRequest{}, invalid("the body could not be read as a run request", err.Error())
	}
	var se *envelope.SchemaError
	if err := a.schemas.Validate(envelope.SchemaRunRequest, filled); errors.As(err, &se) {
		return envelope.RunRequest{}, invalid(fmt.Sprintf("the run request violates its JSON Schema (%d problems)", len(se.Problems)), se.Problems...)
	} else if err != nil {
		return envelope.RunRequest{}, invalid("the run request could not be checked", err.Error())
	}
	if typeErr != nil {
		return envelope.RunRequest{}, typeErr
	}
	var req envelope.RunRequest
	if e := decodeStrict(filled, &req); e != nil {
		return envelope.RunRequest{}, e
	}
	if err := req.Validate(); err != nil {
		return envelope.RunRequest{}, invalid("the run request is not valid", problems(err)...)
	}
	if _, err := events.IntakeSubject(req.Tenant, req.RunID); err != nil {
		return envelope.RunRequest{}, invalid("the request's tenant cannot be handed in on an intake subject", err.Error())
	}
	return req, nil
}

// submit hands req in on its tenant's intake (unless the run id holds a
// request already) and waits, at most Options.SubmitWait, for the run's
// request to be stored; created says whether it is this call's.
func (a *api) submit(ctx context.Context, req envelope.RunRequest) (created bool, _ *apiError) {
	runs, err := a.opts.JS.Stream(ctx, events.StreamRuns)
	if err != nil {
		return false, unavailable(fmt.Sprintf("the runs stream cannot be read now (%v); retry", err))
	}
	subj, err := events.RunSubject(req.RunID, events.VerbRequested)
	if err != nil {
		return false, invalid(err.Error())
	}
	out, err := events.NewRunIntake(source, req, events.RunTraceFrom(ctx))
	if err != nil {
		return false, invalid("the run request could not be built", err.Error())
	}
	mine, err := envelope.Canonicalize(out.Event.Data())
	if err != nil {
		return false, &apiError{status: http.StatusInternalServerError, code: apitypes.CodeInternal, msg: "internal error: " + err.Error()}
	}
	if stored, err := storedRequest(ctx, runs, subj); err != nil {
		return false, unavailable(fmt.Sprintf("the runs stream cannot be read now (%v); retry", err))
	} else if stored != nil {
		return false, sameRequest(stored, req, mine)
	}
	// As client.SubmitToIntake: a nonce in the Nats-Msg-Id, so that no
	// other producer of the tenant can have this request dropped as the
	// duplicate of a message it published first under a guessed id.
	var nonce [16]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails (Go 1.24+)
	out.MsgID += "/" + hex.EncodeToString(nonce[:])
	if err := a.pub.Publish(ctx, out); err != nil {
		return false, unavailable(fmt.Sprintf("the request could not be handed in on the intake now (%v); retry the same request", err))
	}
	deadline := time.Now().Add(a.opts.SubmitWait)
	for delay := 5 * time.Millisecond; ; delay = min(delay*3/2, 250*time.Millisecond) {
		stored, err := storedRequest(ctx, runs, subj)
		if err == nil && stored != nil {
			if e := sameRequest(stored, req, mine); e != nil {
				return false, e
			}
			// Another publication of this same request may have been
			// handed over first (a retry racing this one): this call's
			// own is the one of this call's time.
			return stored.Time().Equal(out.Event.Time()), nil
		}
		if time.Now().Add(delay).After(deadline) {
			return false, unavailable(fmt.Sprintf("the request was handed in on the intake, but the orchestrator has not taken it over within %s; send the same request again to learn its outcome (it never makes a second run)", a.opts.SubmitWait))
		}
		select {
		case <-ctx.Done():
			return false, unavailable("the request was handed in, and its outcome could not be awaited; send the same request again")
		case <-time.After(delay):
		}
	}
}

// storedRequest is the run request stored on subj, nil when there is none.
func storedRequest(ctx context.Context, runs jetstream.Stream, subj string) (*event.Event, error) {
	m, err := runs.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	e, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		return nil, fmt.Errorf("%s holds an unreadable request: %w", subj, err)
	}
	return e, nil
}

// sameRequest answers whether stored is req (of its tenant, equal as
// canonical JSON to mine): nil when it is, 409 run_id_in_use otherwise,
// without showing what another tenant's request holds.
func sameRequest(stored *event.Event, req envelope.RunRequest, mine []byte) *apiError {
	inUse := func(why string) *apiError {
		return &apiError{status: http.StatusConflict, code: apitypes.CodeRunIDInUse,
			msg: fmt.Sprintf("run id %q is in use: %s; choose another run id", req.RunID, why)}
	}
	var had envelope.RunRequest
	if err := events.DecodeData(stored, &had); err != nil {
		return inUse("it holds a request that cannot be read")
	}
	if had.Tenant.OrgID != req.Tenant.OrgID || had.Tenant.WorkspaceID != req.Tenant.WorkspaceID {
		return inUse("another tenant's run has it")
	}
	theirs, err := envelope.Canonicalize(stored.Data())
	if err != nil || !bytes.Equal(theirs, mine) {
		return inUse("it was submitted with another request")
	}
	return nil
}
