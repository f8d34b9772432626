package recorder

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
)

// Error codes of the HTTP API, in {"error": {"code": ..., "message": ...}}.
const (
	CodeInvalidRunID     = "invalid_run_id"
	CodeInvalidParameter = "invalid_parameter"
	CodeRunNotFound      = "run_not_found"
	CodeRunNotCompleted  = "run_not_completed"
	CodeRunFailed        = "run_failed"
	CodeNoRequest        = "run_request_missing"
	CodeCallNotFound     = "call_not_found"
	CodeInvalidCallID    = "invalid_call_id"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
)

// NewAPI returns the recorder's HTTP server on store with default options
// (see NewServer).
func NewAPI(store Store, log *slog.Logger) http.Handler {
	return NewServer(store, ServerOptions{Log: log})
}

// ServerOptions configure NewServer. Zero values mean the defaults.
type ServerOptions struct {
	Log *slog.Logger
	// Changes wakes live event streams as soon as this process commits a
	// run's events; without it (or for other replicas' commits) they poll.
	Changes *Changes
	// JS is the JetStream the blobs of truncated outputs are read from
	// (GET /v1/blobs/...); nil: no blobs.
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
	// then require it as a bearer token; "" turns them off.
	AdminToken string
}

// NewServer returns the recorder's HTTP server on store: the read API
// (documented by openapi.yaml, served at /v1/openapi.yaml), the live event
// stream, and the timeline pages.
//
//	GET /v1/runs                                  runs, newest first (filters: see openapi.yaml)
//	GET /v1/runs/{run_id}                         one run and the summary of its tool calls
//	GET /v1/runs/{run_id}/outputs                 its AgentOutputs, as the completed event carried them
//	GET /v1/runs/{run_id}/envelopes               its ToolEnvelopes in call order
//	GET /v1/runs/{run_id}/events                  its recorded events (?after=seq&limit=)
//	GET /v1/runs/{run_id}/events/stream           the same, live (Server-Sent Events; resumes after Last-Event-ID)
//	GET /v1/runs/{run_id}/replay                  its replay bundle
//	GET /v1/runs/{run_id}/pins                    its pinned handles, stale_last_success included
//	GET /v1/runs/{run_id}/calls/{call_id}         one tool call
//	GET /v1/runs/{run_id}/calls/{call_id}/materialize   the call as a standalone tool-node configuration
//	GET /v1/blobs/{name}                          a blob of a truncated output
//	GET /v1/openapi.yaml                          the API's OpenAPI document
//	GET /  and  GET /runs/{run_id}                the timeline pages
//
// API responses are JSON; errors are {"error": {"code": "...", "message": "..."}}.
func NewServer(store Store, o ServerOptions) http.Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	a := &api{store: store, log: o.Log, opts: o}
	mux := http.NewServeMux()
	route := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc("GET "+pattern, h)
		mux.HandleFunc(pattern, a.methodNotAllowed)
	}
	route("/v1/runs", a.listRuns)
	route("/v1/runs/{run_id}", a.getRun)
	route("/v1/runs/{run_id}/outputs", a.getOutputs)
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
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no such resource: %s", r.URL.Path))
	})
	a.mountPages(mux)
	return mux
}

type api struct {
	store Store
	log   *slog.Logger
	opts  ServerOptions
}

// RunJSON is a run as the API shows it.
type RunJSON struct {
	RunID       string          `json:"run_id"`
	Tenant      envelope.Tenant `json:"tenant"`
	Agent       string          `json:"agent"`
	Status      string          `json:"status"`
	Reason      string          `json:"reason"`
	TraceID     string          `json:"trace_id"`
	Counts      CountsJSON      `json:"counts"`
	Spend       *float64        `json:"spend"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	CompletedAt *time.Time      `json:"completed_at"`
}

// CountsJSON counts a run's model iterations and tool calls.
type CountsJSON struct {
	Iterations int `json:"iterations"`
	ToolCalls  int `json:"tool_calls"`
}

// RunDetailJSON is GET /v1/runs/{run_id}: the run, its request as received
// (null until it arrives), its resolved pinned handles once completed, and its
// tool calls in order.
type RunDetailJSON struct {
	RunJSON
	Request   json.RawMessage `json:"request"`
	Pinned    json.RawMessage `json:"pinned,omitempty"`
	ToolCalls []ToolCallJSON  `json:"tool_calls"`
}

// ToolCallJSON summarizes one tool call, for the timeline: the full receipt is
// in /envelopes.
type ToolCallJSON struct {
	CallID    string     `json:"call_id"`
	Seq       *int       `json:"seq"`
	Iteration *int       `json:"iteration"`
	Name      string     `json:"name"`
	Version   string     `json:"version"`
	Status    string     `json:"status"`
	ErrorCode *string    `json:"error_code"`
	TStart    *time.Time `json:"t_start"`
	TEnd      *time.Time `json:"t_end"`
	LatencyMS *int64     `json:"latency_ms"`
	Cached    bool       `json:"cached"`
	Truncated bool       `json:"truncated"`
}

// RunListJSON is GET /v1/runs.
type RunListJSON struct {
	Runs []RunJSON `json:"runs"`
}

// EnvelopesJSON is GET /v1/runs/{run_id}/envelopes.
type EnvelopesJSON struct {
	RunID     string            `json:"run_id"`
	Envelopes []json.RawMessage `json:"envelopes"`
}

// ErrorJSON is the body of every error response.
type ErrorJSON struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is an error's stable code and human message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func runJSON(r Run) RunJSON {
	return RunJSON{
		RunID: r.RunID, Tenant: r.Tenant, Agent: r.Agent, Status: r.Status, Reason: r.Reason,
		TraceID: r.TraceID, Counts: CountsJSON{Iterations: r.Iterations, ToolCalls: r.ToolCalls},
		Spend: r.Spend, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
	}
}

func toolCallJSON(c ToolCall) ToolCallJSON {
	j := ToolCallJSON{
		CallID: c.CallID, Seq: c.Seq, Iteration: c.Iteration, Name: c.Name, Version: c.Version,
		Status: c.Status, TStart: c.TStart, TEnd: c.TEnd, LatencyMS: c.LatencyMS, Cached: c.Cached,
		Truncated: c.Truncated,
	}
	if c.ErrorCode != "" {
		code := c.ErrorCode
		j.ErrorCode = &code
	}
	return j
}

func (a *api) listRuns(w http.ResponseWriter, r *http.Request) {
	f, err := runFilterOf(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, err.Error())
		return
	}
	runs, err := a.store.ListRuns(r.Context(), f)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	out := RunListJSON{Runs: make([]RunJSON, 0, len(runs))}
	for _, run := range runs {
		out.Runs = append(out.Runs, runJSON(run))
	}
	writeJSON(w, http.StatusOK, out)
}

// runFilterOf reads the filters of GET /v1/runs (and of the runs page).
func runFilterOf(q url.Values) (RunFilter, error) {
	f := RunFilter{Status: q.Get("status"), Agent: q.Get("agent"), OrgID: q.Get("org_id"),
		WorkspaceID: q.Get("workspace_id"), UserID: q.Get("user_id")}
	if f.Status != "" && !slices.Contains(RunStatuses(), f.Status) {
		return f, fmt.Errorf("status %q is not one of %s", f.Status, strings.Join(RunStatuses(), ", "))
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
			return f, fmt.Errorf("limit %q must be a whole number from 1 to %d", v, MaxListLimit)
		}
		f.Limit = n // above MaxListLimit it is clamped
	}
	return f, nil
}

// run reads the run named by the path, or writes the error and returns false.
func (a *api) run(w http.ResponseWriter, r *http.Request) (Run, bool) {
	id := r.PathValue("run_id")
	if events.ValidateRunID(id) != nil {
		if len(id) > 80 {
			id = id[:80] + "..."
		}
		writeError(w, http.StatusBadRequest, CodeInvalidRunID,
			fmt.Sprintf("run_id %q is not a run id: a run id is 1 to 64 letters, digits, '-' or '_'", id))
		return Run{}, false
	}
	run, err := a.store.Run(r.Context(), id)
	if errors.Is(err, ErrRunNotFound) {
		writeError(w, http.StatusNotFound, CodeRunNotFound, fmt.Sprintf("run %q is not recorded", id))
		return Run{}, false
	}
	if err != nil {
		a.internal(w, r, err)
		return Run{}, false
	}
	return run, true
}

func (a *api) getRun(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	calls, err := a.store.ToolCalls(r.Context(), run.RunID)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	out := RunDetailJSON{RunJSON: runJSON(run), Request: run.Request, Pinned: run.Pinned,
		ToolCalls: make([]ToolCallJSON, 0, len(calls))}
	if len(out.Request) == 0 {
		out.Request = json.RawMessage("null")
	}
	for _, c := range calls {
		out.ToolCalls = append(out.ToolCalls, toolCallJSON(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) getOutputs(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	switch run.Status {
	case events.StatusCompleted:
	case events.StatusFailed:
		msg := fmt.Sprintf("run %q failed and has no outputs", run.RunID)
		if run.Reason != "" {
			msg = fmt.Sprintf("run %q failed and has no outputs: %s", run.RunID, run.Reason)
		}
		writeError(w, http.StatusConflict, CodeRunFailed, msg)
		return
	default:
		writeError(w, http.StatusConflict, CodeRunNotCompleted,
			fmt.Sprintf("run %q is %s: its outputs exist once it has completed", run.RunID, run.Status))
		return
	}
	outputs := run.Outputs
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
	writeJSON(w, http.StatusOK, EnvelopesJSON{RunID: run.RunID, Envelopes: envs})
}

func (a *api) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", "GET, HEAD")
	writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
		fmt.Sprintf("%s is not allowed on %s: the API is read-only (GET)", r.Method, r.URL.Path))
}

func (a *api) internal(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	if errors.Is(err, context.DeadlineExceeded) {
		a.log.Warn("api: store timed out", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the store did not answer in time; retry")
		return
	}
	a.log.Error("api: store failed", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, CodeInternal, "internal error; the recorder's log has the details")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error: encoding the response failed")
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
	b, _ := json.Marshal(ErrorJSON{Error: ErrorBody{Code: code, Message: msg}})
	writeRaw(w, status, b)
}
