package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// submitRun is POST /v1/runs: a run request stored on the runs stream as
// client.Submit does, on the condition that the run's request subject holds
// none, and answered once the stream has it: the run starts as it would from
// NATS, without a hop through the tenant's intake (the tenant is the
// credential's, checked here as the orchestrator checks an intake's).
//
// The run id is the idempotency key, and the stream's condition makes the
// answer exact: 201 when this call's publication is the request stored; when
// the subject holds one already, 200 if it is this request (equal as RFC 8785
// canonical JSON, of this tenant), else 409 run_id_in_use.
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
	out, e := a.submitFor(r.Context(), p, body)
	if e != nil {
		if e.status == http.StatusInternalServerError && r.Context().Err() != nil {
			return // the client went away
		}
		e.write(w)
		return
	}
	code := http.StatusOK
	if out.Created {
		code = http.StatusCreated
		w.Header().Set("Location", "/v1/runs/"+url.PathEscape(out.RunID))
	}
	writeJSON(w, code, out)
}

// submitFor submits body, a run request, for p: what POST /v1/runs and the
// agent builder's page (Runs) answer.
func (a *api) submitFor(ctx context.Context, p auth.Principal, body []byte) (apitypes.SubmitJSON, *apiError) {
	req, e := a.runRequestOf(p, body)
	if e != nil {
		return apitypes.SubmitJSON{}, e
	}
	if a.opts.JS == nil {
		return apitypes.SubmitJSON{}, unavailable("this recorder has no NATS connection to hand the request in on; submit with the CLI or the Go client")
	}
	ctx, cancel := context.WithTimeout(ctx, submitWait)
	defer cancel()
	created, e := a.submit(ctx, req)
	if e != nil {
		return apitypes.SubmitJSON{}, e
	}
	status := store.StatusRequested
	if run, err := a.store.Run(ctx, req.RunID); err == nil {
		status = run.Status
	}
	if created {
		a.log.Info("api: run submitted", "run_id", req.RunID, "tenant", req.Tenant.ID(), "by", p.Name)
	}
	return apitypes.SubmitJSON{RunID: req.RunID, Status: status, Created: created}, nil
}

// Runs submits run requests as POST /v1/runs does, for the pages (the
// agent builder) on the same server.
type Runs struct{ a *api }

// NewRuns returns the submitter of runs to js's runs stream; st answers
// a submitted run's status.
func NewRuns(st store.Store, js jetstream.JetStream, log *slog.Logger) (*Runs, error) {
	if log == nil {
		log = slog.Default()
	}
	schemas, err := envelope.NewSchemas(nil)
	if err != nil {
		return nil, err
	}
	a := &api{store: st, log: log, opts: Options{JS: js}, schemas: schemas}
	if js != nil {
		a.pub = publish.NewPublisher(js, publish.WithLogger(log))
	}
	return &Runs{a: a}, nil
}

// SubmitError is a submission refused, as POST /v1/runs would refuse it:
// its HTTP status, code, message and the problems found.
type SubmitError struct {
	Status        int
	Code, Message string
	Details       []string
}

func (e *SubmitError) Error() string {
	if len(e.Details) == 0 {
		return e.Message
	}
	return e.Message + ": " + strings.Join(e.Details, "; ")
}

// Submit is POST /v1/runs with body for the principal of ctx: the role,
// the tenant, the schema and the run id's idempotency are checked as
// there, and a refusal is a *SubmitError.
func (r *Runs) Submit(ctx context.Context, body []byte) (apitypes.SubmitJSON, error) {
	p := auth.FromContext(ctx)
	if e := may(p, auth.RoleProducer, "submitting a run"); e != nil {
		return apitypes.SubmitJSON{}, e.submitError()
	}
	out, e := r.a.submitFor(ctx, p, body)
	if e != nil {
		return apitypes.SubmitJSON{}, e.submitError()
	}
	return out, nil
}

func (e *apiError) submitError() *SubmitError {
	return &SubmitError{Status: e.status, Code: e.code, Message: e.msg, Details: e.details}
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

// submitWait bounds a submission's reads and its publication.
const submitWait = 10 * time.Second

// submit stores req on the runs stream unless the run id holds a request
// already; created says whether it is this call's.
func (a *api) submit(ctx context.Context, req envelope.RunRequest) (created bool, _ *apiError) {
	out, err := events.NewRunRequested(source, req, events.RunTraceFrom(ctx))
	if err != nil {
		return false, invalid("the run request could not be built", err.Error())
	}
	mine, err := envelope.Canonicalize(out.Event.Data())
	if err != nil {
		return false, &apiError{status: http.StatusInternalServerError, code: apitypes.CodeInternal, msg: "internal error: " + err.Error()}
	}
	stored, err := a.pub.PublishFirst(ctx, out)
	if err != nil {
		return false, unavailable(fmt.Sprintf("the request could not be stored now (%v); send the same request again (it never makes a second run)", err))
	}
	if stored {
		return true, nil
	}
	// The subject holds a request: this one (a retry) or another.
	runs, err := a.opts.JS.Stream(ctx, events.StreamRuns)
	if err != nil {
		return false, unavailable(fmt.Sprintf("the runs stream cannot be read now (%v); retry", err))
	}
	had, err := storedRequest(ctx, runs, out.Subject)
	switch {
	case err != nil:
		return false, unavailable(fmt.Sprintf("the runs stream cannot be read now (%v); retry", err))
	case had == nil:
		// Refused, yet nothing there: deleted meanwhile (an operator's
		// purge). Not this call's to redo.
		return false, unavailable(fmt.Sprintf("run id %q was refused by the runs stream, which holds no request for it now; retry", req.RunID))
	}
	return false, sameRequest(had, req, mine)
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
