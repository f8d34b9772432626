package pages

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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// --- the agent node builder ---
//
// The builder is one form, read from the query (GET /builder: every
// "Update preview", pin and clear button re-renders it with what it holds),
// so that a configuration is a link. What it shows is the run request the
// form makes, the agent configuration inside it, and what `toolwire
// validate` says of them (registry.CheckAgentNow, the same check). POST
// /builder/runs submits that request as POST /v1/runs does (api.Runs) and
// opens the run's timeline.

// Defaults of a new builder form: a scripted model that answers at once,
// so that a fresh `toolwire dev` runs what the builder makes.
const (
	builderAgent    = "builder-agent"
	builderProvider = "scripted"
	builderModel    = "demo"
	builderOptions  = `{"script":[{"content":"Hello from the agent node builder."}]}`
	builderMessage  = "Hello"
	// maxPins bounds the pin rows a form may hold.
	maxPins = 32
	// builderRecentRuns is how many of the tenant's runs the by_call_id
	// picker offers.
	builderRecentRuns = 20
)

type builderPage struct {
	Title     string
	User      *userView
	Error     *errorPage
	AskTenant bool
	Form      builderForm
	Groups    []toolGroupView
	Selected  []string
	Pins      []pinRowView
	PinTools  []string
	// The choices of the selects.
	SideEffects []envelope.SideEffects
	Strategies  []envelope.PinStrategy
	Missing     []envelope.OnMissing
	RecentRuns  []string
	// What the form makes, and what validate says of it.
	AgentJSON, RequestJSON string
	Warnings, Problems     []string
	OK                     string
	CanSubmit              bool
	SubmitNote             string
	// Refused is a submission's refusal.
	Refused *api.SubmitError
}

// builderForm is what the form holds, as the query names it.
type builderForm struct {
	RunID, Name, Provider, Model, Options, SystemPrompt, Message string
	OrgID, WorkspaceID                                           string
	ShowDeprecated                                               bool
	MaxIterations, MaxToolCalls, MaxBudget, ApprovalTimeoutS     string
	SideEffects                                                  string
	Scopes                                                       string
	ApproveWrites                                                bool
	Tools, ApproveTools                                          []string
	Pins                                                         []pinForm
}

// pinForm is one pinned handle's row.
type pinForm struct {
	Name, Tool, Strategy, Run, CallID, OnMissing string
}

type pinRowView struct {
	pinForm
	Index int
	// Calls are the calls of Run to Tool, for a by_call_id pin.
	Calls   []callOptionView
	RunNote string
	// Note says what the handle outputs when its tool is not enabled.
	Note string
}

type callOptionView struct {
	ID, Label string
	Selected  bool
}

type toolGroupView struct {
	Kind, Label string
	Tools       []builderToolView
}

type builderToolView struct {
	Ref, Name, Description string
	Selected, Approve      bool
	Pinned, Deprecated     bool
	Auth, AuthLabel        string
}

// readBuilderForm reads the form from q; a new form (no agent name) gets
// the defaults and a fresh run id.
func readBuilderForm(q url.Values) builderForm {
	f := builderForm{
		RunID: strings.TrimSpace(q.Get("run_id")), Name: strings.TrimSpace(q.Get("name")),
		Provider: strings.TrimSpace(q.Get("provider")), Model: strings.TrimSpace(q.Get("model")),
		Options: strings.TrimSpace(q.Get("options")), SystemPrompt: q.Get("system_prompt"), Message: q.Get("message"),
		OrgID: strings.TrimSpace(q.Get("org_id")), WorkspaceID: strings.TrimSpace(q.Get("workspace_id")),
		ShowDeprecated: q.Get("show_deprecated") == "true",
		MaxIterations:  strings.TrimSpace(q.Get("max_iterations")), MaxToolCalls: strings.TrimSpace(q.Get("max_tool_calls")),
		MaxBudget: strings.TrimSpace(q.Get("max_budget")), ApprovalTimeoutS: strings.TrimSpace(q.Get("approval_timeout_s")),
		SideEffects: q.Get("side_effects"), Scopes: q.Get("scopes"), ApproveWrites: q.Get("approve_writes") == "true",
	}
	if !q.Has("name") && !q.Has("run_id") {
		f.Name, f.Provider, f.Model, f.Options, f.Message = builderAgent, builderProvider, builderModel, builderOptions, builderMessage
	}
	if f.RunID == "" {
		f.RunID = newBuilderRunID()
	}
	f.Tools = uniqueNonEmpty(q["tool"])
	f.ApproveTools = uniqueNonEmpty(q["approve_tool"])
	names, tools, strategies, runs, calls, missing := q["pin_name"], q["pin_tool"], q["pin_strategy"], q["pin_run"], q["pin_call"], q["pin_missing"]
	at := func(vs []string, i int) string {
		if i < len(vs) {
			return strings.TrimSpace(vs[i])
		}
		return ""
	}
	for i := range min(max(len(names), len(tools)), maxPins) {
		p := pinForm{Name: at(names, i), Tool: at(tools, i), Strategy: at(strategies, i), Run: at(runs, i), CallID: at(calls, i), OnMissing: at(missing, i)}
		if p.Name == "" && p.Tool == "" {
			continue // an empty row
		}
		f.Pins = append(f.Pins, p)
	}
	switch {
	case q.Get("clear") == "tools":
		f.Tools, f.ApproveTools = nil, nil
	case q.Has("unpin"):
		if i, err := strconv.Atoi(q.Get("unpin")); err == nil && i >= 0 && i < len(f.Pins) {
			f.Pins = slices.Delete(f.Pins, i, i+1)
		}
	case q.Get("pin") != "" && len(f.Pins) < maxPins:
		f.Pins = append(f.Pins, pinForm{Name: f.pinName(q.Get("pin")), Tool: q.Get("pin"), Strategy: string(envelope.PinLatest), OnMissing: string(envelope.MissingNull)})
	}
	return f
}

// pinName is a handle name for a new pin of tool that no pin has yet.
func (f builderForm) pinName(tool string) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, tool)
	if base == "" || base[0] >= '0' && base[0] <= '9' || base[0] == '-' {
		base = "_" + base
	}
	base = base[:min(len(base), 56)] // ASCII: Map kept nothing else
	taken := func(n string) bool {
		return slices.ContainsFunc(f.Pins, func(p pinForm) bool { return p.Name == n })
	}
	name := base
	for i := 2; taken(name); i++ {
		name = fmt.Sprintf("%s_%d", base, i)
	}
	return name
}

func newBuilderRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return "builder-" + hex.EncodeToString(b)
}

func uniqueNonEmpty(vs []string) []string {
	var out []string
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// request is the run request the form makes for p, and what of the form
// cannot be read (each a problem, as validate would print it).
func (f builderForm) request(p auth.Principal) (envelope.RunRequest, []string) {
	var problems []string
	req := envelope.RunRequest{
		RunID: f.RunID,
		Agent: envelope.Agent{Name: f.Name, Model: envelope.Model{Provider: f.Provider, Name: f.Model},
			SystemPrompt: f.SystemPrompt, EnabledTools: append([]string{}, f.Tools...)},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: f.Message}},
	}
	if p.AllTenants() {
		req.Tenant = envelope.Tenant{OrgID: f.OrgID, WorkspaceID: f.WorkspaceID}
	} else {
		req.Tenant = envelope.Tenant{OrgID: p.OrgID, WorkspaceID: p.WorkspaceID}
	}
	if f.Options != "" {
		var opts map[string]any
		if err := json.Unmarshal([]byte(f.Options), &opts); err != nil || opts == nil {
			problems = append(problems, "agent.model.options: not a JSON object")
		} else {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(f.Options)) == nil {
				req.Agent.Model.Options = buf.Bytes()
			}
		}
	}
	whole := func(field, s string, to *int) {
		if s == "" {
			return
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			problems = append(problems, fmt.Sprintf("agent.policy.%s: %q is not a whole number of 0 or more", field, s))
			return
		}
		*to = n
	}
	pol := &req.Agent.Policy
	whole("max_iterations", f.MaxIterations, &pol.MaxIterations)
	whole("max_tool_calls", f.MaxToolCalls, &pol.MaxToolCalls)
	whole("approval_timeout_s", f.ApprovalTimeoutS, &pol.ApprovalTimeoutS)
	if f.MaxBudget != "" {
		b, err := strconv.ParseFloat(f.MaxBudget, 64)
		if err != nil || b < 0 {
			problems = append(problems, fmt.Sprintf("agent.policy.max_budget: %q is not an amount of 0 or more", f.MaxBudget))
		} else {
			pol.MaxBudget = b
		}
	}
	pol.SideEffects = envelope.SideEffects(f.SideEffects)
	for s := range strings.FieldsFuncSeq(f.Scopes, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		if !slices.Contains(pol.Scopes, s) {
			pol.Scopes = append(pol.Scopes, s)
		}
	}
	if f.ApproveWrites || len(f.ApproveTools) > 0 {
		pol.RequireApproval = &envelope.ApprovalPolicy{Writes: f.ApproveWrites, Tools: f.ApproveTools}
	}
	for _, pf := range f.Pins {
		h := envelope.PinnedHandle{Name: pf.Name, Selector: envelope.PinSelector{Tool: pf.Tool, Strategy: envelope.PinStrategy(pf.Strategy)},
			OnMissing: envelope.OnMissing(pf.OnMissing)}
		if h.Selector.Strategy == envelope.PinByCallID {
			h.Selector.CallID = pf.CallID
		}
		req.Agent.PinnedHandles = append(req.Agent.PinnedHandles, h)
	}
	return req, problems
}

// enabledNames are the bare names of the form's enabled tools.
func (f builderForm) enabledNames() []string {
	var out []string
	for _, s := range f.Tools {
		if ref, err := envelope.ParseToolRef(s); err == nil {
			out = append(out, ref.Name)
		}
	}
	return out
}

func (p *pages) builderPage(w http.ResponseWriter, r *http.Request) {
	f := readBuilderForm(r.URL.Query())
	if from := r.URL.Query().Get("from_run"); from != "" && !r.URL.Query().Has("name") {
		loaded, ok := p.fromRun(w, r, from, r.URL.Query().Get("pin_call"))
		if !ok {
			return
		}
		f = loaded
	}
	data, status := p.builderData(r, f)
	p.renderPage(w, r, p.builder, "base.html", status, data)
}

// submitBuilt is POST /builder/runs: the form's run request submitted as
// POST /v1/runs would submit it; its timeline opens.
func (p *pages) submitBuilt(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	f := readBuilderForm(r.PostForm)
	pr := auth.FromContext(r.Context())
	req, problems := f.request(pr)
	refuse := func(e *api.SubmitError) {
		data, _ := p.builderData(r, f)
		data.Refused = e
		p.renderPage(w, r, p.builder, "base.html", e.Status, data)
	}
	switch {
	case !pr.Can(auth.RoleProducer):
		refuse(&api.SubmitError{Status: http.StatusForbidden, Code: apitypes.CodeForbidden,
			Message: fmt.Sprintf("you are a %s: submitting a run needs the role producer or above", pr.Role)})
		return
	case p.opts.Runs == nil:
		refuse(&api.SubmitError{Status: http.StatusServiceUnavailable, Code: apitypes.CodeUnavailable,
			Message: "this recorder has no NATS connection to submit runs on"})
		return
	case len(problems) > 0:
		refuse(&api.SubmitError{Status: http.StatusUnprocessableEntity, Code: apitypes.CodeInvalidRequest,
			Message: "the form does not make a run request", Details: problems})
		return
	}
	body, err := json.Marshal(req)
	if err != nil {
		refuse(&api.SubmitError{Status: http.StatusUnprocessableEntity, Code: apitypes.CodeInvalidRequest, Message: err.Error()})
		return
	}
	out, err := p.opts.Runs.Submit(r.Context(), body)
	if err != nil {
		var se *api.SubmitError
		if !errors.As(err, &se) {
			se = &api.SubmitError{Status: http.StatusInternalServerError, Code: apitypes.CodeInternal, Message: err.Error()}
		}
		refuse(se)
		return
	}
	p.log.Info("builder: run submitted", "run_id", out.RunID, "by", pr.Name, "created", out.Created)
	p.awaitRecorded(r.Context(), out.RunID)
	http.Redirect(w, r, "/runs/"+url.PathEscape(out.RunID), http.StatusSeeOther)
}

// recordedWait bounds how long a submission waits for the recorder to
// have its run, so that the timeline it opens shows the run.
const recordedWait = 5 * time.Second

// awaitRecorded waits, up to recordedWait, until the store holds run
// runID; past that, the timeline says the run is not recorded yet.
func (p *pages) awaitRecorded(ctx context.Context, runID string) {
	ctx, cancel := context.WithTimeout(ctx, recordedWait)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := p.store.Run(ctx, runID); err == nil || !errors.Is(err, store.ErrRunNotFound) {
			return
		}
		select {
		case <-ctx.Done():
			p.log.Warn("builder: the submitted run is not recorded yet", "run_id", runID, "waited", recordedWait)
			return
		case <-t.C:
		}
	}
}

// builderData is what the builder shows of f for the visitor of r.
func (p *pages) builderData(r *http.Request, f builderForm) (builderPage, int) {
	ctx := r.Context()
	pr := auth.FromContext(ctx)
	data := builderPage{Title: "Agent builder", User: userOf(r), AskTenant: pr.AllTenants(), Form: f,
		SideEffects: []envelope.SideEffects{envelope.SideEffectsNone, envelope.SideEffectsReads, envelope.SideEffectsWrites},
		Strategies:  []envelope.PinStrategy{envelope.PinLatest, envelope.PinFirstSuccess, envelope.PinByCallID},
		Missing:     []envelope.OnMissing{envelope.MissingNull, envelope.MissingError, envelope.MissingStaleLastSuccess},
		CanSubmit:   pr.Can(auth.RoleProducer) && p.opts.Runs != nil,
	}
	switch {
	case !pr.Can(auth.RoleProducer):
		data.SubmitNote = fmt.Sprintf("You are a %s: submitting a run needs the role producer or above. Copy the request instead.", pr.Role)
	case p.opts.Runs == nil:
		data.SubmitNote = "This recorder has no NATS connection to submit runs on."
	}
	if p.opts.Catalog == nil {
		data.Error = &errorPage{Title: "No tool registry", Message: "This recorder has no NATS connection to read the tool registry from."}
		return data, http.StatusServiceUnavailable
	}
	q := url.Values{}
	if f.ShowDeprecated {
		q.Set("show_deprecated", "true")
	}
	if pr.AllTenants() && f.OrgID != "" {
		q.Set("org_id", f.OrgID)
		if f.WorkspaceID != "" {
			q.Set("workspace_id", f.WorkspaceID)
		}
	}
	c, err := p.opts.Catalog.List(ctx, q)
	if err != nil {
		var ce *api.CatalogError
		if errors.As(err, &ce) {
			data.Error = &errorPage{Title: "Bad tenant", Message: ce.Message}
			return data, ce.Status
		}
		p.log.Warn("builder: the catalog cannot be read", "err", err)
		data.Error = &errorPage{Title: "The tool registry cannot be read now", Message: "Retry in a moment; the recorder's log has the details."}
		return data, http.StatusServiceUnavailable
	}
	pinned := map[string]bool{}
	for _, pf := range f.Pins {
		pinned[pf.Tool] = true
	}
	groups := map[string]*toolGroupView{}
	listed := map[string]bool{}
	for _, t := range c.Tools {
		g := groups[t.Kind]
		if g == nil {
			g = &toolGroupView{Kind: t.Kind, Label: kindLabels[t.Kind]}
			groups[t.Kind] = g
		}
		v := toolViewOf(t)
		g.Tools = append(g.Tools, builderToolView{Ref: t.Ref, Name: t.Name, Description: t.Description,
			Selected: slices.Contains(f.Tools, t.Ref), Approve: slices.Contains(f.ApproveTools, t.Name),
			Pinned: pinned[t.Name], Deprecated: t.Deprecated, Auth: v.Auth, AuthLabel: v.AuthLabel})
		listed[t.Ref] = true
		if !slices.Contains(data.PinTools, t.Name) {
			data.PinTools = append(data.PinTools, t.Name)
		}
	}
	for _, k := range api.ToolKinds() {
		if g := groups[k]; g != nil {
			data.Groups = append(data.Groups, *g)
		}
	}
	data.Selected = f.Tools
	// A pin keeps its tool when the tool is no longer listed.
	for _, pf := range f.Pins {
		if pf.Tool != "" && !slices.Contains(data.PinTools, pf.Tool) {
			data.PinTools = append(data.PinTools, pf.Tool)
		}
	}
	enabled := f.enabledNames()
	for i, pf := range f.Pins {
		row := pinRowView{pinForm: pf, Index: i}
		if pf.Tool != "" && !slices.Contains(enabled, pf.Tool) {
			switch envelope.OnMissing(pf.OnMissing) {
			case envelope.MissingError:
				row.Note = "tool " + pf.Tool + " is not enabled: no call can match, and on_missing error fails the node"
			case envelope.MissingStaleLastSuccess:
				row.Note = "tool " + pf.Tool + " is not enabled: the handle stays and outputs the last successful run's value, else null"
			default:
				row.Note = "tool " + pf.Tool + " is not enabled: the handle stays and outputs null"
			}
		}
		if pf.Strategy == string(envelope.PinByCallID) && pf.Run != "" {
			row.Calls, row.RunNote = p.callsOf(ctx, pr, pf.Run, pf.Tool, pf.CallID)
		}
		data.Pins = append(data.Pins, row)
	}
	data.RecentRuns = p.recentRuns(ctx, pr)

	req, problems := f.request(pr)
	data.AgentJSON, data.RequestJSON = indentJSON(req.Agent), indentJSON(req)
	data.Problems = problems
	if err := req.Validate(); err != nil {
		data.Problems = append(data.Problems, problemLines(err)...)
	}
	if p.opts.JS != nil {
		fs, err := registry.CheckAgentNow(ctx, p.opts.JS, req.Agent)
		if err != nil {
			p.log.Warn("builder: the registry cannot be read to check the agent", "err", err)
			data.Warnings = append(data.Warnings, "the registry cannot be read now: the enabled tools are not checked")
		} else {
			data.Warnings = append(data.Warnings, fs.Warnings...)
			data.Problems = append(data.Problems, fs.Problems...)
		}
	}
	if len(data.Warnings)+len(data.Problems) == 0 {
		data.OK = fmt.Sprintf("ok: agent %s, %d enabled tools", req.Agent.Name, len(req.Agent.EnabledTools))
	}
	return data, http.StatusOK
}

// problemLines are the problems of a validation error (RunRequest.Validate
// joins them with "; " after its sentinel).
func problemLines(err error) []string {
	s := strings.TrimPrefix(err.Error(), envelope.ErrInvalidRequest.Error()+": ")
	var out []string
	for l := range strings.SplitSeq(s, "; ") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func indentJSON(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return ""
	}
	return string(b)
}

// recentRuns are the ids of the visitor's tenant's newest runs, for the
// by_call_id picker.
func (p *pages) recentRuns(ctx context.Context, pr auth.Principal) []string {
	f := store.RunFilter{Limit: builderRecentRuns}
	if !api.ScopeFilter(pr, &f) {
		return nil
	}
	runs, err := p.store.ListRuns(ctx, f)
	if err != nil {
		p.log.Warn("builder: the recent runs cannot be read", "err", err)
		return nil
	}
	ids := make([]string, 0, len(runs))
	for _, r := range runs {
		ids = append(ids, r.RunID)
	}
	return ids
}

// callsOf are the calls of tool in run runID that the visitor may see, as
// choices of a by_call_id pin, or why there are none.
func (p *pages) callsOf(ctx context.Context, pr auth.Principal, runID, tool, chosen string) ([]callOptionView, string) {
	if envelope.ValidateRunID(runID) != nil {
		return nil, fmt.Sprintf("%q is not a run id", truncate(runID, 80))
	}
	run, err := p.store.Run(ctx, runID)
	if err == nil && !pr.Sees(run.Tenant) {
		err = store.ErrRunNotFound
	}
	if err != nil {
		if errors.Is(err, store.ErrRunNotFound) {
			return nil, "run " + runID + " is not recorded"
		}
		p.log.Warn("builder: a run's calls cannot be read", "run_id", runID, "err", err)
		return nil, storeDidNotAnswer
	}
	calls, err := p.store.ToolCalls(ctx, runID)
	if err != nil {
		p.log.Warn("builder: a run's calls cannot be read", "run_id", runID, "err", err)
		return nil, storeDidNotAnswer
	}
	var out []callOptionView
	for _, c := range calls {
		if c.Name != tool {
			continue
		}
		label := c.CallID[:min(12, len(c.CallID))] + " · " + c.Status
		if c.Seq != nil {
			label = fmt.Sprintf("call %d · %s", *c.Seq, label)
		}
		if len(c.Input) > 0 {
			label += " · " + truncate(string(c.Input), 60)
		}
		out = append(out, callOptionView{ID: c.CallID, Label: label, Selected: c.CallID == chosen})
	}
	if len(out) == 0 {
		return nil, "run " + runID + " made no call of " + tool
	}
	return out, ""
}

// fromRun is a builder form holding run runID's agent, message and model,
// under a new run id; pinCall (a call of that run) becomes a by_call_id pin.
func (p *pages) fromRun(w http.ResponseWriter, r *http.Request, runID, pinCall string) (builderForm, bool) {
	if envelope.ValidateRunID(runID) != nil {
		p.pageError(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a run id: a run id is 1 to 64 letters, digits, '-' or '_'.", truncate(runID, 80)))
		return builderForm{}, false
	}
	pr := auth.FromContext(r.Context())
	run, err := p.store.Run(r.Context(), runID)
	if err == nil && !pr.Sees(run.Tenant) {
		err = fmt.Errorf("%w: %s", store.ErrRunNotFound, runID)
	}
	if p.runReadFailed(w, r, runID, err, "builder") {
		return builderForm{}, false
	}
	var req envelope.RunRequest
	if len(run.Request) == 0 || json.Unmarshal(run.Request, &req) != nil {
		p.pageError(w, r, http.StatusNotFound, fmt.Sprintf("Run %q has no recorded request to build from.", runID))
		return builderForm{}, false
	}
	a := req.Agent
	f := builderForm{RunID: newBuilderRunID(), Name: a.Name, Provider: a.Model.Provider, Model: a.Model.Name,
		SystemPrompt: a.SystemPrompt, Tools: a.EnabledTools, Scopes: strings.Join(a.Policy.Scopes, ", "), SideEffects: string(a.Policy.SideEffects)}
	if len(a.Model.Options) > 0 {
		f.Options = string(a.Model.Options)
	}
	if pr.AllTenants() {
		f.OrgID, f.WorkspaceID = req.Tenant.OrgID, req.Tenant.WorkspaceID
	}
	for _, m := range req.Messages {
		if m.Role == envelope.RoleUser {
			f.Message = m.Content
			break
		}
	}
	num := func(n int) string {
		if n == 0 {
			return ""
		}
		return strconv.Itoa(n)
	}
	f.MaxIterations, f.MaxToolCalls, f.ApprovalTimeoutS = num(a.Policy.MaxIterations), num(a.Policy.MaxToolCalls), num(a.Policy.ApprovalTimeoutS)
	if a.Policy.MaxBudget > 0 {
		f.MaxBudget = strconv.FormatFloat(a.Policy.MaxBudget, 'f', -1, 64)
	}
	if ap := a.Policy.RequireApproval; ap != nil {
		f.ApproveWrites, f.ApproveTools = ap.Writes, ap.Tools
	}
	for _, h := range a.PinnedHandles {
		f.Pins = append(f.Pins, pinForm{Name: h.Name, Tool: h.Selector.Tool, Strategy: string(h.Selector.Strategy), CallID: h.Selector.CallID,
			OnMissing: string(h.OnMissing), Run: runIfByCall(h, runID)})
	}
	if pinCall != "" {
		calls, err := p.store.ToolCalls(r.Context(), runID)
		if err != nil {
			p.log.Error("builder", "run_id", runID, "err", err)
			p.pageError(w, r, http.StatusInternalServerError, storeDidNotAnswer)
			return builderForm{}, false
		}
		i := slices.IndexFunc(calls, func(c store.ToolCall) bool { return c.CallID == pinCall })
		if i < 0 {
			p.pageError(w, r, http.StatusNotFound, fmt.Sprintf("Run %q made no call %q.", runID, truncate(pinCall, 80)))
			return builderForm{}, false
		}
		if len(f.Pins) < maxPins {
			f.Pins = append(f.Pins, pinForm{Name: f.pinName(calls[i].Name), Tool: calls[i].Name, Strategy: string(envelope.PinByCallID),
				Run: runID, CallID: pinCall, OnMissing: string(envelope.MissingNull)})
		}
	}
	return f, true
}

func runIfByCall(h envelope.PinnedHandle, runID string) string {
	if h.Selector.Strategy == envelope.PinByCallID {
		return runID
	}
	return ""
}
