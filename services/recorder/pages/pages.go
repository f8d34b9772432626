// Package pages holds the recorder's pages: the runs list and a run's timeline,
// plain server-rendered HTML (html/template, embedded), one stylesheet and one
// small script. The run page follows the run's live event stream (package
// api) and, on each event, fetches its timeline fragment again from the
// server (GET /runs/{run_id}/timeline), so that the page shows what the store
// holds and nothing is rendered twice.
package pages

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

//go:embed templates/*.html assets/*
var embedded embed.FS

// Limits of what a page shows inline; the API has everything.
const (
	maxInlineJSON = 64 << 10
	pageRunsLimit = 100
)

type pages struct {
	store   store.Store
	log     *slog.Logger
	opts    Options
	runs    *template.Template
	run     *template.Template
	login   *template.Template
	tools   *template.Template
	admin   *template.Template
	builder *template.Template
	assets  http.Handler
	pub     *publish.Publisher // the Cancel button's; nil without a JetStream
}

// Options configure New. Zero values mean the defaults.
type Options struct {
	Log *slog.Logger
	// Auth authenticates the pages' visitors (an API token or OIDC token,
	// pasted once on the login page and kept in a session cookie); nil:
	// authentication off, every visitor is auth.Open.
	Auth *auth.Authenticator
	// JS is where the approval buttons publish decisions (and read the
	// approval records); nil: the timeline shows no buttons.
	JS jetstream.JetStream
	// Catalog lists the tool catalog of the tools page (GET /tools); nil:
	// the page says the registry is not available.
	Catalog *api.Catalog
	// Runs submits the agent builder's run requests (POST /builder/runs),
	// as POST /v1/runs does; nil: the builder shows the request only.
	Runs *api.Runs
	// InsecureCookie sends the session cookie without Secure, so that a
	// browser keeps it over plain HTTP beyond loopback (a private network
	// you trust, on purpose). Without it the cookie is Secure, except to a
	// browser on http:// at a loopback address (see secureCookie).
	InsecureCookie bool
	// MCPStdio lets the registry page start a stdio MCP server's command
	// to register its tools (recorder.Config.MCPStdio); without it the
	// page registers streamable HTTP servers only.
	MCPStdio bool
}

// New returns the pages on st:
//
//	GET  /                          the runs, newest first (the filters of GET /v1/runs)
//	GET  /tools                     the tool catalog: search, category, kind, show deprecated, each tool's key status
//	GET  /builder                   the agent node builder (viewers): tools, policy, pinned handles, the run request and what validate says of it (?from_run= starts from a run, &pin_call= pins one of its calls)
//	POST /builder/runs              submits the builder's run request (producers), then opens its timeline
//	GET  /admin/tools               the registry (admins of every tenant): register an HTTP tool, change a version's state, who changed what and when
//	POST /admin/tools, POST /admin/mcp, POST /admin/tools/{ref}/state   the registry page's forms (an HTTP tool, an MCP server's tools, a state)
//	GET  /runs/{run_id}             a run's timeline, live while the run goes on
//	GET  /runs/{run_id}/timeline    the timeline alone, which the run page fetches on each event
//	POST /runs/{run_id}/calls/{call_id}/decision   approve, deny or revise a call that awaits approval (approvers)
//	POST /runs/{run_id}/cancel      cancel a run that has not ended (approvers)
//	GET  /login, POST /login        the login page: a token pasted becomes the session cookie
//	POST /logout                    ends the session
//	GET  /assets/...                the stylesheet and the script
//
// The run page reads the JSON API (package api) at /v1/ of the same server.
// When authentication is on, every page but /login and /assets needs a
// session (or a bearer token); a visitor without one gets the login page.
// Pages show only the visitor's tenant's runs: another tenant's run is "not
// recorded". Every POST is refused unless it comes from this origin
// (http.CrossOriginProtection: the browser's Sec-Fetch-Site, else Origin,
// must be this server's), which is the pages' CSRF protection, beside the
// session cookie's SameSite=Lax.
func New(st store.Store, o Options) http.Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	p := newPages(st, o.Log)
	p.opts = o
	if o.JS != nil {
		p.pub = publish.NewPublisher(o.JS, publish.WithLogger(o.Log))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", p.runsPage)
	mux.HandleFunc("GET /tools", p.toolsPage)
	mux.HandleFunc("GET /builder", p.builderPage)
	mux.HandleFunc("POST /builder/runs", p.submitBuilt)
	mux.HandleFunc("GET /admin/tools", p.adminPage)
	mux.HandleFunc("POST /admin/tools", p.register)
	mux.HandleFunc("POST /admin/mcp", p.registerMCP)
	mux.HandleFunc("POST /admin/tools/{ref}/state", p.setState)
	mux.HandleFunc("POST /admin/tools/{ref}/publish", p.publish)
	mux.HandleFunc("GET /runs/{run_id}", func(w http.ResponseWriter, r *http.Request) { p.runPage(w, r, false) })
	mux.HandleFunc("GET /runs/{run_id}/timeline", func(w http.ResponseWriter, r *http.Request) { p.runPage(w, r, true) })
	mux.HandleFunc("POST /runs/{run_id}/calls/{call_id}/decision", p.decide)
	mux.HandleFunc("POST /runs/{run_id}/cancel", p.cancel)
	mux.HandleFunc("GET /login", p.loginPage)
	mux.HandleFunc("POST /login", p.loginSubmit)
	mux.HandleFunc("POST /logout", p.logout)
	mux.Handle("GET /assets/", cacheAssets(p.assets))
	h := o.Auth.Middleware(mux, publicPage, p.unauthenticated)
	return csrfProtection().Handler(h)
}

// publicPage says which requests need no session: the login page and the
// assets it uses.
func publicPage(r *http.Request) bool {
	return r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/assets/")
}

func newPages(st store.Store, log *slog.Logger) *pages {
	funcs := template.FuncMap{"lower": strings.ToLower}
	parse := func(files ...string) *template.Template {
		paths := make([]string, len(files))
		for i, f := range files {
			paths[i] = "templates/" + f
		}
		return template.Must(template.New("base.html").Funcs(funcs).ParseFS(embedded, paths...))
	}
	assets, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return &pages{
		store:   st,
		log:     log,
		runs:    parse("base.html", "runs.html"),
		run:     parse("base.html", "run.html", "runbody.html"),
		login:   parse("base.html", "login.html"),
		tools:   parse("base.html", "tools.html"),
		admin:   parse("base.html", "admin.html"),
		builder: parse("base.html", "builder.html"),
		assets:  http.StripPrefix("/assets/", http.FileServerFS(assets)),
	}
}

func cacheAssets(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

func htmlHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
}

func (p *pages) renderPage(w http.ResponseWriter, r *http.Request, t *template.Template, name string, status int, data any) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, data); err != nil {
		p.log.Error("render page", "path", r.URL.Path, "err", err)
		http.Error(w, "internal error; the recorder's log has the details", http.StatusInternalServerError)
		return
	}
	htmlHeaders(w)
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorPage is the data of a page that could not show what was asked.
type errorPage struct {
	Title   string
	Message string
}

// storeDidNotAnswer is the page of a store that failed.
const storeDidNotAnswer = "The store did not answer; the recorder's log has the details."

// runReadFailed answers a page whose read of run runID ended in err, unless
// err is nil: a run that is not recorded (store.ErrRunNotFound, which is
// also what a run the reader may not see is) is a 404, any other error a 500,
// logged under msg. It reports whether it answered.
func (p *pages) runReadFailed(w http.ResponseWriter, r *http.Request, runID string, err error, msg string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, store.ErrRunNotFound):
		p.pageError(w, r, http.StatusNotFound, fmt.Sprintf("Run %q is not recorded (yet).", runID))
	default:
		p.log.Error(msg, "run_id", runID, "err", err)
		p.pageError(w, r, http.StatusInternalServerError, storeDidNotAnswer)
	}
	return true
}

func (p *pages) pageError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p.renderPage(w, r, p.runs, "base.html", status, runsPage{Title: http.StatusText(status), User: userOf(r), Error: &errorPage{
		Title: http.StatusText(status), Message: msg}})
}

// --- the runs page ---

type runsPage struct {
	Title   string
	User    *userView
	Error   *errorPage
	Filter  runsFilterView
	Runs    []runRowView
	Count   int
	Limited bool
}

type runsFilterView struct {
	Status, Agent, Tenant, Since, Until string
	Statuses                            []string
}

type runRowView struct {
	RunID, Agent, Tenant, Status string
	Iterations, ToolCalls        int
	Spend, Created, Duration     string
	Reason                       string
}

func (p *pages) runsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	fv := runsFilterView{Status: q.Get("status"), Agent: q.Get("agent"), Tenant: q.Get("tenant"),
		Since: q.Get("since"), Until: q.Get("until"), Statuses: store.RunStatuses()}
	data := runsPage{Title: "Runs", Filter: fv, User: userOf(r)}
	f, err := api.ParseRunFilter(q)
	if err != nil {
		data.Error = &errorPage{Title: "Bad filter", Message: err.Error()}
		p.renderPage(w, r, p.runs, "base.html", http.StatusBadRequest, data)
		return
	}
	if f.Limit == 0 {
		f.Limit = pageRunsLimit
	}
	var runs []store.Run
	if api.ScopeFilter(auth.FromContext(r.Context()), &f) {
		runs, err = p.store.ListRuns(r.Context(), f)
	}
	if err != nil {
		p.log.Error("runs page", "err", err)
		p.pageError(w, r, http.StatusInternalServerError, storeDidNotAnswer)
		return
	}
	for _, run := range runs {
		data.Runs = append(data.Runs, runRowView{
			RunID: run.RunID, Agent: run.Agent, Tenant: tenantLabel(run.Tenant), Status: run.Status,
			Iterations: run.Iterations, ToolCalls: run.ToolCalls, Spend: spendLabel(run.Spend),
			Created: run.CreatedAt.Format("2006-01-02 15:04:05"), Duration: runDuration(run), Reason: run.Reason,
		})
	}
	data.Count, data.Limited = len(runs), len(runs) == f.EffectiveLimit()
	p.renderPage(w, r, p.runs, "base.html", http.StatusOK, data)
}

// --- the run page ---

type runPage struct {
	Title string
	User  *userView
	Error *errorPage
	Run   runView
}

type runView struct {
	RunID, Agent, Tenant, Status, Reason string
	Model, Created, Duration, Spend      string
	Iterations, ToolCalls                int
	TracesURL, TraceID                   string
	Response                             string
	HasResponse                          bool
	Live                                 bool
	LastSeq                              int64
	Warnings                             []string
	Steps                                []iterationView
	Loose                                []callView
	Tokens                               string
	StreamURL                            string
	// Cancel shows the Cancel button: the run has not ended and the
	// visitor is an approver of its tenant.
	Cancel    bool
	CancelURL string
	// Pins are the agent node's pinned handles and their values, once
	// the run has ended.
	Pins []pinValueView
	// BuilderURL opens the agent builder on the run's configuration.
	BuilderURL string
}

// pinValueView is a pinned handle of an ended run: what it outputs.
type pinValueView struct {
	Name, Tool, Strategy, Source string
	// Value is the selected call's result, "null" when none is.
	Value, CallID, Short, Error string
}

type iterationView struct {
	N       int
	Verdict *verdictView
	Turn    *turnView
	Calls   []callView
}

type verdictView struct {
	Allowed      bool
	Code, Reason string
}

type turnView struct {
	Model, Latency, Tokens, StopReason, Content string
	Cost                                        string
	Asked                                       int
}

type callView struct {
	Key, Short                  string
	Seq                         string
	Name, Version               string
	Status, ErrorCode, ErrorMsg string
	Latency, Started            string
	Cached, Truncated           bool
	Input, Output, Error        string
	Attachments                 []attachmentView
	Steps                       []callStepView
	Approval                    string // pending, approved, denied, revised, expired, "": the decision applied
	// Deciding: a decision is recorded that the guard has not yet answered.
	Deciding                bool
	Queue, Cost             string
	SecretScopes            string
	Warnings                []string
	MaterializeURL, JSONURL string
	Pending                 bool
	// Decide shows the approval form: the call awaits a decision and the
	// visitor is an approver of its tenant.
	Decide    bool
	DecideURL string
	// PinURL opens the agent builder on the run with this call pinned
	// (strategy by_call_id).
	PinURL string
	// Gate and GateCell are the gate matrix's verdict on the call and the
	// cell that gave it, from its approval request or its approved event.
	Gate, GateCell, GateNote string
}

type attachmentView struct {
	Kind, URL, ContentType, Size string
}

type callStepView struct {
	Time, Label, Detail, Class string
}

func (p *pages) runPage(w http.ResponseWriter, r *http.Request, fragment bool) {
	id := r.PathValue("run_id")
	if events.ValidateRunID(id) != nil {
		p.pageError(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a run id: a run id is 1 to 64 letters, digits, '-' or '_'.", truncate(id, 80)))
		return
	}
	who := auth.FromContext(r.Context())
	view, err := p.buildRunView(r.Context(), id, who)
	if p.runReadFailed(w, r, id, err, "run page") {
		return
	}
	data := runPage{Title: "Run " + id, Run: view, User: userOf(r)}
	if fragment {
		p.renderPage(w, r, p.run, "runbody", http.StatusOK, data)
		return
	}
	p.renderPage(w, r, p.run, "base.html", http.StatusOK, data)
}

// buildRunView reads what the timeline shows of run id, as who sees it: a
// run of another tenant is ErrRunNotFound, and the approval buttons are for
// approvers only.
func (p *pages) buildRunView(ctx context.Context, id string, who auth.Principal) (runView, error) {
	run, err := p.store.Run(ctx, id)
	if err != nil {
		return runView{}, err
	}
	if !who.Sees(run.Tenant) {
		return runView{}, fmt.Errorf("%w: %s", store.ErrRunNotFound, id)
	}
	canDecide := p.opts.JS != nil && who.Can(auth.RoleApprover) && !store.IsTerminal(run.Status)
	calls, err := p.store.ToolCalls(ctx, id)
	if err != nil {
		return runView{}, err
	}
	turns, err := api.Turns(ctx, p.store, id, calls)
	if err != nil {
		return runView{}, err
	}
	evs, err := p.store.Events(ctx, id)
	if err != nil {
		return runView{}, err
	}
	v := runView{
		RunID: id, Agent: run.Agent, Tenant: tenantLabel(run.Tenant), Status: run.Status, Reason: run.Reason,
		Created: run.CreatedAt.Format("2006-01-02 15:04:05 MST"), Duration: runDuration(run), Spend: spendLabel(run.Spend),
		Iterations: run.Iterations, ToolCalls: run.ToolCalls, TraceID: run.TraceID, Live: !store.IsTerminal(run.Status),
		StreamURL: "/v1/runs/" + url.PathEscape(id) + "/events/stream",
		Cancel:    canDecide, CancelURL: "/runs/" + url.PathEscape(id) + "/cancel",
		BuilderURL: "/builder?" + url.Values{"from_run": {id}}.Encode(),
	}
	if store.IsTerminal(run.Status) {
		v.Pins = p.pinValues(ctx, run)
	}
	if len(evs) > 0 {
		v.LastSeq = evs[len(evs)-1].Seq
	}
	if len(run.Request) > 0 {
		var req envelope.RunRequest
		if json.Unmarshal(run.Request, &req) == nil {
			v.Model = strings.Trim(req.Agent.Model.Provider+" / "+req.Agent.Model.Name, " /")
		}
	}
	if len(run.Outputs) > 0 {
		var out envelope.AgentOutputs
		if json.Unmarshal(run.Outputs, &out) == nil {
			v.Response, v.HasResponse, v.TracesURL = out.Response, true, out.TracesURL
		}
	} else if run.Status == events.StatusCompleted && len(run.OutputsBlob) > 0 {
		// The outputs are in a blob: the final answer is the last turn's.
		for _, t := range turns {
			if t.Response != nil && len(t.Response.ToolCalls) == 0 {
				v.Response, v.HasResponse = t.Response.Content, true
			}
		}
	}
	byCall := map[string][]store.EventRow{}
	for _, e := range evs {
		if e.CallID != "" {
			byCall[e.CallID] = append(byCall[e.CallID], e)
		}
		if e.Type == events.TypeRunStarted {
			var s struct {
				Warnings []string `json:"warnings"`
			}
			if json.Unmarshal(e.Data, &s) == nil {
				v.Warnings = append(v.Warnings, s.Warnings...)
			}
		}
	}
	iters := map[int]*iterationView{}
	iter := func(n int) *iterationView {
		if iters[n] == nil {
			iters[n] = &iterationView{N: n}
		}
		return iters[n]
	}
	// requestedAt is when each turn's model answered: the calls it made were
	// requested then.
	requestedAt := map[int]time.Time{}
	var in, out int
	for _, t := range turns {
		it := iter(t.Iteration)
		v.Warnings = append(v.Warnings, t.Warnings...)
		if vd := t.Verdict; vd != nil {
			it.Verdict = &verdictView{Allowed: vd.Allowed, Code: vd.Code, Reason: vd.Reason}
		}
		resp := t.Response
		if resp == nil {
			continue // denied: the model was not called
		}
		in += resp.Usage.InputTokens
		out += resp.Usage.OutputTokens
		tv := &turnView{
			Tokens:     fmt.Sprintf("%d in · %d out", resp.Usage.InputTokens, resp.Usage.OutputTokens),
			StopReason: resp.StopReason, Content: resp.Content, Asked: len(resp.ToolCalls),
		}
		if t.Model != nil {
			tv.Model = t.Model.Name
		}
		if t.TStart != nil && t.TEnd != nil {
			tv.Latency = latencyLabel(t.TEnd.Sub(*t.TStart))
			requestedAt[t.Iteration] = *t.TEnd
		}
		switch {
		case t.Unpriced:
			tv.Cost = "unpriced"
		case t.Cost != nil:
			tv.Cost = spendLabel(t.Cost)
		}
		it.Turn = tv
	}
	if in+out > 0 {
		v.Tokens = fmt.Sprintf("%d in · %d out", in, out)
	}
	for _, c := range calls {
		var asked *time.Time
		if c.Iteration != nil {
			if at, ok := requestedAt[*c.Iteration]; ok {
				asked = &at
			}
		}
		cv := callViewOf(id, c, asked, byCall[c.CallID])
		cv.Decide = canDecide && cv.Approval == "pending" && !cv.Deciding && c.Status != store.CallCompleted // not timed out
		if c.Iteration == nil {
			v.Loose = append(v.Loose, cv)
			continue
		}
		it := iter(*c.Iteration)
		it.Calls = append(it.Calls, cv)
	}
	ns := make([]int, 0, len(iters))
	for n := range iters {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	for _, n := range ns {
		v.Steps = append(v.Steps, *iters[n])
	}
	return v, nil
}

// pinValues are what run's pinned handles output (api.ResolvePins, as GET
// /v1/runs/{run_id}/pins): a handle that selects no call shows null.
func (p *pages) pinValues(ctx context.Context, run store.Run) []pinValueView {
	pins, err := api.ResolvePins(ctx, p.store, run, api.BlobReader(p.opts.JS))
	if err != nil {
		if !errors.Is(err, store.ErrNoRequest) {
			p.log.Warn("run page: the pinned handles cannot be resolved", "run_id", run.RunID, "err", err)
		}
		return nil
	}
	out := make([]pinValueView, 0, len(pins.Pins))
	for _, pj := range pins.Pins {
		v := pinValueView{Name: pj.Name, Tool: pj.Selector.Tool, Strategy: string(pj.Selector.Strategy), Source: pj.Source, Value: "null", Error: pj.Error}
		if v.Strategy == "" {
			v.Strategy = string(envelope.PinLatest)
		}
		if e := pj.Value; e != nil {
			v.CallID, v.Short = e.CallID, approvals.ShortCallID(e.CallID)
			switch {
			case e.Error != nil:
				v.Value = "error " + string(e.Error.Code) + ": " + e.Error.Message
			case len(e.Output) > 0:
				v.Value = truncate(string(e.Output), 400)
			}
		}
		out = append(out, v)
	}
	return out
}

// callViewOf shows one call: its summary, its input and result, and its
// steps. asked is when its model turn requested it (nil: not recorded); the
// other steps are its events: approved, started (only for a call still
// running after the executor's threshold), the approvals, completed.
func callViewOf(runID string, c store.ToolCall, asked *time.Time, evs []store.EventRow) callView {
	base := "/v1/runs/" + url.PathEscape(runID) + "/calls/" + url.PathEscape(c.CallID)
	cv := callView{
		Key: c.CallID, Short: approvals.ShortCallID(c.CallID), Name: c.Name, Version: c.Version, Status: c.Status,
		ErrorCode: c.ErrorCode, Cached: c.Cached, Truncated: c.Truncated, Input: prettyJSON(c.Input),
		MaterializeURL: base + "/materialize", JSONURL: base, Pending: c.Status != store.CallCompleted,
		DecideURL: "/runs/" + url.PathEscape(runID) + "/calls/" + url.PathEscape(c.CallID) + "/decision",
		Queue:     c.Queue,
		PinURL:    "/builder?" + url.Values{"from_run": {runID}, "pin_call": {c.CallID}}.Encode(),
	}
	if c.Cost != nil && *c.Cost > 0 {
		cv.Cost = spendLabel(c.Cost)
	}
	if asked != nil {
		cv.Steps = append(cv.Steps, callStepView{Time: asked.Format("15:04:05.000"), Label: "requested by the model", Class: "muted"})
	}
	if c.Seq != nil {
		cv.Seq = "#" + strconv.Itoa(*c.Seq)
	}
	if c.LatencyMS != nil {
		cv.Latency = latencyLabel(time.Duration(*c.LatencyMS) * time.Millisecond)
	}
	if c.TStart != nil {
		cv.Started = c.TStart.Format("15:04:05.000")
	}
	if len(c.Envelope) > 0 {
		var env envelope.ToolEnvelope
		if json.Unmarshal(c.Envelope, &env) == nil {
			if env.Error != nil {
				cv.ErrorMsg = env.Error.Message
				b, _ := json.Marshal(env.Error)
				cv.Error = prettyJSON(b)
			} else {
				cv.Output = prettyJSON(env.Output)
				if cv.Output == "" {
					cv.Output = "null"
				}
			}
			for _, at := range env.Attachments {
				av := attachmentView{Kind: string(at.Kind), URL: at.URL, ContentType: at.ContentType}
				if at.Bytes > 0 {
					av.Size = sizeLabel(at.Bytes)
				}
				cv.Attachments = append(cv.Attachments, av)
			}
		}
	}
	// The approval badge is the decision the Policy Guard applied, as its
	// outcome shows it, not the last decision recorded; the others are
	// shown as ignored (store.ApprovalOf).
	ap := store.ApprovalOf(evs)
	cv.Approval = ap.State
	cv.Deciding = len(ap.Awaiting) > 0
	decisions := map[string]string{} // event id: what became of the decision
	if ap.Applied != nil && ap.Applied.Event != "" {
		decisions[ap.Applied.Event] = "applied"
	}
	for _, d := range ap.Ignored {
		decisions[d.Event] = "ignored: " + d.Why
	}
	for _, d := range ap.Awaiting {
		decisions[d.Event] = "received"
	}
	scopes := map[string]string{}
	for _, e := range evs {
		step := callStepView{Time: e.Time.Format("15:04:05.000")}
		var d map[string]any
		_ = json.Unmarshal(e.Data, &d)
		str := func(k string) string {
			if s, ok := d[k].(string); ok {
				return s
			}
			return ""
		}
		var gated struct {
			Gate *envelope.GateVerdict `json:"gate"`
		}
		if (e.Type == events.TypeCallApproved || e.Type == events.TypeCallApprovalRequired) && json.Unmarshal(e.Data, &gated) == nil && gated.Gate != nil {
			cv.Gate, cv.GateCell, cv.GateNote = string(gated.Gate.Gate), gated.Gate.Cell(), gated.Gate.Note
		}
		switch e.Type {
		case events.TypeCallApproved:
			step.Label, step.Class = "allowed by policy", "ok"
			if b, _ := d["operator_approved"].(bool); b {
				step.Label = "approved by an operator"
			}
			if q := str("queue"); q != "" {
				step.Detail = "to queue " + q
			}
		case events.TypeCallStarted:
			step.Label, step.Class = "started", "muted"
			if ex := str("executor"); ex != "" {
				step.Detail = "on " + ex
			}
			var s struct {
				SecretScopes map[string]string `json:"secret_scopes"`
				Warnings     []string          `json:"warnings"`
			}
			if json.Unmarshal(e.Data, &s) == nil {
				for k, val := range s.SecretScopes {
					scopes[k] = val
				}
				cv.Warnings = append(cv.Warnings, s.Warnings...)
			}
		case events.TypeCallCompleted:
			step.Label, step.Class = "completed", "ok"
			if c.ErrorCode != "" {
				step.Label, step.Class = "failed: "+c.ErrorCode, "bad"
				if c.ErrorCode == string(envelope.CodePolicyDenied) {
					step.Label = "denied by policy"
				}
			}
			if cv.Cost != "" {
				step.Detail = "cost " + cv.Cost
			}
			if ap.State == store.ApprovalWithdrawn {
				step.Label, step.Class = "approval withdrawn: the run was cancelled", "muted"
			}
		case events.TypeCallApprovalRequired:
			step.Label, step.Class = "approval required", "warn"
			step.Detail = strings.TrimSpace(strings.Join(nonEmpty(str("reason"), str("effect_description")), " — "))
		case events.TypeCallDecided:
			dec := str("decision")
			step.Label = "decision: " + dec
			step.Class = map[string]string{"approve": "ok", "deny": "bad", "revise": "warn"}[dec]
			what := decisions[e.ID] // applied, ignored: why, received
			if strings.HasPrefix(what, "ignored") {
				step.Class = "muted"
			}
			step.Detail = strings.Join(nonEmpty(by(str("by")), str("note"), what), " — ")
		default:
			step.Label, step.Class = strings.TrimPrefix(strings.TrimSuffix(e.Type, ".v1"), "dev.toolwire."), "muted"
		}
		cv.Steps = append(cv.Steps, step)
	}
	if len(scopes) > 0 {
		names := make([]string, 0, len(scopes))
		for k := range scopes {
			names = append(names, k)
		}
		sort.Strings(names)
		parts := make([]string, 0, len(names))
		for _, k := range names {
			parts = append(parts, k+": "+scopes[k])
		}
		cv.SecretScopes = strings.Join(parts, ", ")
	}
	return cv
}

func by(s string) string {
	if s == "" {
		return ""
	}
	return "by " + s
}

func nonEmpty(ss ...string) []string {
	out := ss[:0]
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// prettyJSON indents a JSON document for display, cut at maxInlineJSON.
func prettyJSON(b []byte) string {
	if len(b) == 0 || string(b) == "null" {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return string(b)
	}
	s := buf.String()
	if len(s) > maxInlineJSON {
		return s[:maxInlineJSON] + "\n… (cut here: the call's JSON has all of it)"
	}
	return s
}

func tenantLabel(t envelope.Tenant) string {
	return strings.Join(nonEmpty(t.OrgID, t.WorkspaceID, t.UserID), " / ")
}

func spendLabel(s *float64) string {
	if s == nil {
		return ""
	}
	return "$" + strconv.FormatFloat(*s, 'f', 4, 64)
}

func runDuration(r store.Run) string {
	if r.CompletedAt == nil {
		return ""
	}
	return latencyLabel(r.CompletedAt.Sub(r.CreatedAt))
}

func latencyLabel(d time.Duration) string {
	switch {
	case d < 0:
		return ""
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s"
	}
	return d.Round(time.Second).String()
}

func sizeLabel(n int64) string {
	switch {
	case n < 1<<10:
		return strconv.FormatInt(n, 10) + " B"
	case n < 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
