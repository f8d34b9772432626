// Package api is the recorder's JSON API over a store.Store: runs, their
// outputs, envelopes, events, replay bundles, pinned handles and tool calls,
// the live event stream (Server-Sent Events), the blobs of truncated outputs,
// the tool catalog and the registry's admin routes. openapi.yaml documents it;
// package apitypes holds its response types for clients.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Watcher follows a run for a live reader until stop is called.
type Watcher interface {
	Watch(runID string) (stop func())
}

// Options configure New. Zero values mean the defaults.
type Options struct {
	Log *slog.Logger
	// Changes wakes live event streams as soon as this process commits a
	// run's events; without it (or for other replicas' commits) they poll.
	Changes *Changes
	// Live, when set, is told of each run a live event stream waits on,
	// for as long as it does (the recorder then records that run as it
	// happens rather than at its consumers' poll); nil: nothing is.
	Live Watcher
	// Deltas, when set, are the live deltas of runs whose agent streams
	// (pkg/events/delta.go): a live event stream relays those of its run
	// as messages of event type "delta" (deltas.go); nil: none are.
	Deltas DeltaSource
	// JS is the JetStream the blobs of truncated outputs are read from
	// (GET /v1/blobs/...) and the tool registry of the catalog; nil: neither.
	JS jetstream.JetStream
	// Poll is how often a live stream looks for new events; default 1s.
	Poll time.Duration
	// Heartbeat is how often an idle live stream sends a comment, so that
	// proxies keep it open; default 15s.
	Heartbeat time.Duration
	// Done, when closed, ends the live streams (the recorder closes it when
	// it stops, so that an HTTP server's shutdown does not wait for them).
	Done <-chan struct{}
	// AdminToken enables the registry's admin routes (catalog.go), which
	// then require it as a bearer token; "" turns them off. Ignored when
	// Auth is set (its config holds the admin token).
	AdminToken string
	// Auth authenticates requests and scopes every read to the principal's
	// tenant (package auth); nil: authentication off (every request is
	// auth.Open), with AdminToken guarding the admin routes.
	Auth *auth.Authenticator
	// StreamWait bounds how long a live stream opened before its run is
	// recorded waits for it; default 30s.
	StreamWait time.Duration
}

// New returns the recorder's JSON API on st, every route under /v1/
// (documented by openapi.yaml, served at /v1/openapi.yaml; the response types
// are package apitypes):
//
//	GET /v1/runs                                  runs, newest first (filters: see openapi.yaml)
//	POST /v1/runs                                 submit a run request (stored as client.Submit does)
//	POST /v1/runs/{run_id}/cancel                 cancel a run
//	POST /v1/runs/{run_id}/calls/{call_id}/decision   approve, deny or revise a call that awaits approval
//	GET /v1/runs/{run_id}                         one run and the summary of its tool calls
//	GET /v1/runs/{run_id}/outputs                 its AgentOutputs, as the completed event carried them (or its blob); ?wait= waits for the end
//	GET /v1/runs/{run_id}/turns                   its model turns: verdicts, responses, costs, calls
//	GET /v1/runs/{run_id}/envelopes               its ToolEnvelopes in call order
//	GET /v1/runs/{run_id}/events                  its recorded events (?after=seq&limit=)
//	GET /v1/runs/{run_id}/events/stream           the same, live (Server-Sent Events; resumes after Last-Event-ID)
//	GET /v1/runs/{run_id}/replay                  its replay bundle (envelope.ReplayBundle)
//	GET /v1/runs/{run_id}/pins                    its pinned handles, stale_last_success included
//	GET /v1/runs/{run_id}/calls/{call_id}         one tool call
//	GET /v1/runs/{run_id}/calls/{call_id}/materialize   the call as a standalone tool-node configuration
//	GET /v1/blobs/{name}                          a blob of a truncated output
//	GET /v1/tools, /v1/admin/tools/...            the tool catalog and the registry's admin routes (catalog.go)
//	GET /v1/openapi.yaml                          the API's OpenAPI document
//
// Responses are JSON; errors are {"error": {"code": "...", "message": "...",
// "details": [...]}} (details for an invalid request only). The writes
// (writes.go) publish what the CLI and the Go client publish, with the
// tenant the credential gives.
//
// Every route but /v1/openapi.yaml authenticates the request (o.Auth) when
// authentication is on (401 otherwise), and every read is scoped to the
// principal's tenant: a run, its events, calls, blobs, bundle or stream of
// another tenant answer 404 exactly as a run never recorded does. A
// state-changing request authenticated by the pages' session cookie must
// come from the recorder's own origin (403 otherwise); bearer tokens need
// no such check.
func New(st store.Store, o Options) http.Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Auth == nil {
		// Authentication off; the admin token (if any) still guards the
		// admin routes. Config{} with an admin token always validates.
		o.Auth, _ = auth.New(auth.Config{AdminToken: o.AdminToken}, st, o.Log)
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	if o.StreamWait <= 0 {
		o.StreamWait = 30 * time.Second
	}
	schemas, err := envelope.NewSchemas(nil)
	if err != nil {
		panic(err) // the embedded contract schemas always compile (pkg/envelope's tests)
	}
	a := &api{store: st, log: o.Log, opts: o, schemas: schemas}
	if o.JS != nil {
		a.pub = publish.NewPublisher(o.JS, publish.WithLogger(o.Log))
	}
	mux := http.NewServeMux()
	route := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc("GET "+pattern, h)
		mux.HandleFunc(pattern, a.methodNotAllowed)
	}
	post := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc("POST "+pattern, h)
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { a.notAllowed(w, r, "POST") })
	}
	mux.HandleFunc("GET /v1/runs", a.listRuns)
	mux.HandleFunc("POST /v1/runs", a.submitRun)
	mux.HandleFunc("/v1/runs", func(w http.ResponseWriter, r *http.Request) { a.notAllowed(w, r, "GET, HEAD, POST") })
	post("/v1/runs/{run_id}/cancel", a.cancelRun)
	post("/v1/runs/{run_id}/calls/{call_id}/decision", a.decideCall)
	route("/v1/runs/{run_id}", a.getRun)
	route("/v1/runs/{run_id}/outputs", a.getOutputs)
	route("/v1/runs/{run_id}/turns", a.getTurns)
	route("/v1/runs/{run_id}/envelopes", a.getEnvelopes)
	route("/v1/runs/{run_id}/events", a.getEvents)
	route("/v1/runs/{run_id}/events/stream", a.streamEvents)
	route("/v1/runs/{run_id}/replay", a.getReplay)
	route("/v1/runs/{run_id}/pins", a.getPins)
	route("/v1/runs/{run_id}/calls/{call_id}", a.getCall)
	route("/v1/runs/{run_id}/calls/{call_id}/materialize", a.getMaterialize)
	route("/v1/blobs/{name}", a.blobsHandler())
	route("/v1/openapi.yaml", serveOpenAPI)
	a.mountToolCatalog(mux) // GET /v1/tools and /v1/admin/tools (catalog.go)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apitypes.CodeNotFound, fmt.Sprintf("no such resource: %s", r.URL.Path))
	})
	return a.sameOrigin(o.Auth.Middleware(mux, isPublic, Unauthenticated))
}

// sameOrigin refuses (403) a state-changing request (POST, PUT, PATCH,
// DELETE) authenticated by the session cookie that a browser sent from
// another origin than the recorder's own (auth.CheckOrigin: scheme, host and
// port exactly). The cookie is SameSite=Lax, which a page of another port
// or of a sibling subdomain is not kept from: it is the same site. A
// request with a bearer token carries no ambient credential and is not
// checked.
func (a *api) sameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth.StateChanging(r) && auth.CookieAuthenticated(r) {
			if err := auth.CheckOrigin(r); err != nil {
				a.log.Warn("api: cross-origin request refused", "method", r.Method, "path", r.URL.Path, "err", err)
				writeError(w, http.StatusForbidden, apitypes.CodeForbidden, err.Error())
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// isPublic says which requests need no credentials: the OpenAPI document.
func isPublic(r *http.Request) bool { return r.URL.Path == "/v1/openapi.yaml" }

// Unauthenticated answers a request whose credentials are missing or
// invalid (401, with the way to authenticate), or could not be checked now
// (503).
func Unauthenticated(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, auth.ErrUnavailable) {
		writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable, "credentials cannot be checked now; retry")
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="toolwire"`)
	msg := "authentication required: send Authorization: Bearer <token> (an API token from `toolwire tokens create`, or an OIDC ID token)"
	switch {
	case errors.Is(err, auth.ErrBadClaim):
		msg = err.Error() // which claim is malformed: the token's holder can fix it
	case errors.Is(err, auth.ErrBadCredentials):
		msg = "invalid credentials: the bearer token is unknown, revoked, expired or not valid for this recorder"
	}
	writeError(w, http.StatusUnauthorized, apitypes.CodeUnauthorized, msg)
}

// notFoundRun answers a run that is not recorded, or not the principal's
// tenant's: the same answer, so that another tenant's runs do not show.
func notFoundRun(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, apitypes.CodeRunNotFound, fmt.Sprintf("run %q is not recorded", id))
}

type api struct {
	store   store.Store
	log     *slog.Logger
	opts    Options
	schemas *envelope.Schemas
	pub     *publish.Publisher // nil without a JetStream
}

func runJSON(r store.Run) apitypes.RunJSON {
	return apitypes.RunJSON{
		RunID: r.RunID, Tenant: r.Tenant, Agent: r.Agent, Status: r.Status, Reason: r.Reason,
		TraceID: r.TraceID, Counts: apitypes.CountsJSON{Iterations: r.Iterations, ToolCalls: r.ToolCalls},
		Spend: r.Spend, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
	}
}

func toolCallJSON(c store.ToolCall) apitypes.ToolCallJSON {
	j := apitypes.ToolCallJSON{
		CallID: c.CallID, Seq: c.Seq, Iteration: c.Iteration, Name: c.Name, Version: c.Version,
		Status: c.Status, TStart: c.TStart, TEnd: c.TEnd, LatencyMS: c.LatencyMS, Cached: c.Cached,
		Truncated: c.Truncated, Cost: c.Cost,
	}
	if c.ErrorCode != "" {
		code := c.ErrorCode
		j.ErrorCode = &code
	}
	if c.Queue != "" {
		q := c.Queue
		j.Queue = &q
	}
	return j
}

func (a *api) listRuns(w http.ResponseWriter, r *http.Request) {
	f, err := ParseRunFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, err.Error())
		return
	}
	p := auth.FromContext(r.Context())
	if !ScopeFilter(p, &f) {
		writeJSON(w, http.StatusOK, apitypes.RunListJSON{Runs: []apitypes.RunJSON{}})
		return
	}
	runs, err := a.store.ListRuns(r.Context(), f)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	out := apitypes.RunListJSON{Runs: make([]apitypes.RunJSON, 0, len(runs))}
	for _, run := range runs {
		out.Runs = append(out.Runs, runJSON(run))
	}
	writeJSON(w, http.StatusOK, out)
}

// ScopeFilter narrows f to the runs p sees, and reports false when f asks
// for another tenant's runs (the answer is then empty). The runs list of the
// API and of the pages apply it.
func ScopeFilter(p auth.Principal, f *store.RunFilter) bool {
	if p.AllTenants() {
		return true
	}
	if p.OrgID == "" || (f.OrgID != "" && f.OrgID != p.OrgID) {
		return false
	}
	f.OrgID = p.OrgID
	if p.WorkspaceID != "" {
		if f.WorkspaceID != "" && f.WorkspaceID != p.WorkspaceID {
			return false
		}
		f.WorkspaceID = p.WorkspaceID
	}
	return true
}

// ParseRunFilter reads the filters of GET /v1/runs (and of the runs page).
func ParseRunFilter(q url.Values) (store.RunFilter, error) {
	f := store.RunFilter{Status: q.Get("status"), Agent: q.Get("agent"), OrgID: q.Get("org_id"),
		WorkspaceID: q.Get("workspace_id"), UserID: q.Get("user_id")}
	if f.Status != "" && !slices.Contains(store.RunStatuses(), f.Status) {
		return f, fmt.Errorf("status %q is not one of %s", f.Status, strings.Join(store.RunStatuses(), ", "))
	}
	if t := q.Get("tenant"); t != "" {
		// A tenant id as events carry it: org[/workspace[/user]].
		parts := strings.Split(t, "/")
		if len(parts) > 3 || parts[0] == "" {
			return f, fmt.Errorf("tenant %q must be org_id, org_id/workspace_id or org_id/workspace_id/user_id", t)
		}
		for i, dst := range []*string{&f.OrgID, &f.WorkspaceID, &f.UserID} {
			if i >= len(parts) || parts[i] == "" {
				continue
			}
			if *dst != "" && *dst != parts[i] {
				return f, fmt.Errorf("tenant %q disagrees with the org_id, workspace_id or user_id given", t)
			}
			*dst = parts[i]
		}
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, fmt.Errorf("%s %q must be an RFC 3339 time such as 2026-03-01T12:00:00Z", p.name, v)
		}
		*p.dst = t.UTC()
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, fmt.Errorf("since %s must be before until %s", f.Since.Format(time.RFC3339Nano), f.Until.Format(time.RFC3339Nano))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, fmt.Errorf("limit %q must be a whole number from 1 to %d", v, store.MaxListLimit)
		}
		f.Limit = n // above MaxListLimit it is clamped
	}
	return f, nil
}

// run reads the run named by the path, or writes the error and returns false.
func (a *api) run(w http.ResponseWriter, r *http.Request) (store.Run, bool) {
	id, ok := a.runID(w, r)
	if !ok {
		return store.Run{}, false
	}
	run, err := a.store.Run(r.Context(), id)
	if errors.Is(err, store.ErrRunNotFound) {
		notFoundRun(w, id)
		return store.Run{}, false
	}
	if err != nil {
		a.internal(w, r, err)
		return store.Run{}, false
	}
	if !auth.FromContext(r.Context()).Sees(run.Tenant) {
		notFoundRun(w, id)
		return store.Run{}, false
	}
	return run, true
}

// runCalls reads the run named by the path and its tool calls, or writes the
// error and returns false.
func (a *api) runCalls(w http.ResponseWriter, r *http.Request) (store.Run, []store.ToolCall, bool) {
	run, ok := a.run(w, r)
	if !ok {
		return store.Run{}, nil, false
	}
	calls, err := a.store.ToolCalls(r.Context(), run.RunID)
	if err != nil {
		a.internal(w, r, err)
		return store.Run{}, nil, false
	}
	return run, calls, true
}

func (a *api) getRun(w http.ResponseWriter, r *http.Request) {
	run, calls, ok := a.runCalls(w, r)
	if !ok {
		return
	}
	out := apitypes.RunDetailJSON{RunJSON: runJSON(run), Request: run.Request, Pinned: run.Pinned,
		Settled: store.Settled(run, calls), ToolCalls: make([]apitypes.ToolCallJSON, 0, len(calls))}
	if len(out.Request) == 0 {
		out.Request = json.RawMessage("null")
	}
	if len(run.OutputsBlob) > 0 {
		var att envelope.Attachment
		if err := json.Unmarshal(run.OutputsBlob, &att); err != nil {
			a.internal(w, r, fmt.Errorf("run %q: outputs_blob: %w", run.RunID, err))
			return
		}
		out.OutputsBlob = &att
	}
	for _, c := range calls {
		out.ToolCalls = append(out.ToolCalls, toolCallJSON(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getOutputs(w http.ResponseWriter, r *http.Request) {
	wait, err := parseWait(r.URL.Query().Get("wait"))
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, err.Error())
		return
	}
	run, ok := store.Run{}, false
	if wait > 0 {
		run, ok = a.awaitRun(w, r, wait)
	} else {
		run, ok = a.run(w, r)
	}
	if !ok {
		return
	}
	switch run.Status {
	case events.StatusCompleted, events.StatusCancelled: // a cancelled run's hold what completed
	case events.StatusFailed:
		msg := fmt.Sprintf("run %q failed and has no outputs", run.RunID)
		if run.Reason != "" {
			msg = fmt.Sprintf("run %q failed and has no outputs: %s", run.RunID, run.Reason)
		}
		writeError(w, http.StatusConflict, apitypes.CodeRunFailed, msg)
		return
	default:
		writeError(w, http.StatusConflict, apitypes.CodeRunNotCompleted,
			fmt.Sprintf("run %q is %s: its outputs exist once it has completed", run.RunID, run.Status))
		return
	}
	outputs, _, err := store.RunOutputs(r.Context(), run, a.blobReader())
	if err != nil {
		a.blobError(w, r, run, err)
		return
	}
	if len(outputs) == 0 {
		// A completed event without outputs: the contract still promises its
		// shape, never null.
		b, err := json.Marshal(envelope.AgentOutputs{})
		if err != nil {
			a.internal(w, r, err)
			return
		}
		outputs = b
	}
	writeRaw(w, http.StatusOK, outputs)
}

func (a *api) getEnvelopes(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	envs, err := a.store.Envelopes(r.Context(), run.RunID)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.EnvelopesJSON{RunID: run.RunID, Envelopes: envs})
}

// blobReader reads blobs from JetStream's object store; nil without a
// JetStream.
func (a *api) blobReader() store.BlobReader { return BlobReader(a.opts.JS) }

// BlobReader reads the blobs of js's object store (the outputs of runs too
// large for an event), as the API and the pages read them; nil for a nil
// js.
func BlobReader(js jetstream.JetStream) store.BlobReader {
	if js == nil {
		return nil
	}
	return func(ctx context.Context, name string) ([]byte, error) {
		b, _, err := blobs.Get(ctx, js, name)
		return b, err
	}
}

// blobError answers a failure to read a run's outputs blob.
func (a *api) blobError(w http.ResponseWriter, r *http.Request, run store.Run, err error) {
	switch {
	case errors.Is(err, store.ErrOutputsInBlob):
		writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable,
			fmt.Sprintf("run %q's outputs are in a blob and this recorder has no JetStream to read it from", run.RunID))
	case errors.Is(err, blobs.ErrNotFound):
		writeError(w, http.StatusNotFound, apitypes.CodeBlobNotFound,
			fmt.Sprintf("run %q's outputs are in a blob the object store no longer holds: %v", run.RunID, err))
	default:
		a.internal(w, r, err)
	}
}

func (a *api) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	a.notAllowed(w, r, "GET, HEAD")
}

// notAllowed answers a method the path does not take (405, with Allow).
func (a *api) notAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, apitypes.CodeMethodNotAllowed,
		fmt.Sprintf("%s is not allowed on %s: it takes %s", r.Method, r.URL.Path, allow))
}

func (a *api) internal(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	if errors.Is(err, context.DeadlineExceeded) {
		a.log.Warn("api: store timed out", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable, "the store did not answer in time; retry")
		return
	}
	a.log.Error("api: store failed", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, apitypes.CodeInternal, "internal error; the recorder's log has the details")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, apitypes.CodeInternal, "internal error: encoding the response failed")
		return
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte("\n"))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(apitypes.ErrorJSON{Error: apitypes.ErrorBody{Code: code, Message: msg}})
	writeRaw(w, status, b)
}
