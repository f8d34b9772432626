package pages

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// --- the tools page ---

type toolsPage struct {
	Title      string
	User       *userView
	Error      *errorPage
	Tenant     string // whose keys the badges are about
	AskTenant  bool   // the visitor is of every tenant: the form asks which
	Filter     toolsFilterView
	Categories []envelope.Category
	Kinds      []kindCardView
	Tools      []toolView
}

type toolsFilterView struct {
	Search, Category, Kind string
	OrgID, WorkspaceID     string
	ShowDeprecated         bool
}

// kindCardView is a kind's summary card: how many tools of it the
// listing holds, a link to them alone.
type kindCardView struct {
	Kind, Label, URL string
	Count            int
}

type toolView struct {
	apitypes.CatalogToolJSON
	KindLabel                string
	Auth                     string // the status, for the badge's class
	AuthLabel, AuthTitle     string
	ScopeLabel, ScopeWarning string
	Secrets                  []apitypes.SecretStatusJSON
	Input, Output            string // the schemas, indented
	Timeout                  string
	HealthLabel, HealthTitle string
	// RateLimited: the tenant may make no call now (RateTitle says when
	// it may); RateDetail describes the limit.
	RateLimited           bool
	RateTitle, RateDetail string
}

var kindLabels = map[string]string{
	api.KindBuiltin: "Built-in", api.KindHTTP: "HTTP", api.KindMCP: "MCP", api.KindSandbox: "Sandbox", api.KindWorker: "Worker queue",
}

// toolsPage lists the catalog (GET /v1/tools) of the visitor's tenant.
func (p *pages) toolsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	pr := auth.FromContext(r.Context())
	fv := toolsFilterView{Search: q.Get("search"), Category: q.Get("category"), Kind: q.Get("kind"),
		OrgID: q.Get("org_id"), WorkspaceID: q.Get("workspace_id"), ShowDeprecated: q.Get("show_deprecated") == "true"}
	data := toolsPage{Title: "Tools", User: userOf(r), Filter: fv, AskTenant: pr.AllTenants(),
		Categories: []envelope.Category{envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility}}
	if p.opts.Catalog == nil {
		data.Error = &errorPage{Title: "No tool registry", Message: "This recorder has no NATS connection to read the tool registry from."}
		p.renderPage(w, r, p.tools, "base.html", http.StatusServiceUnavailable, data)
		return
	}
	// The kind is applied here, after the cards have counted every kind.
	all := url.Values{}
	for _, k := range []string{"search", "category", "show_deprecated", "org_id", "workspace_id"} {
		if v := q.Get(k); v != "" {
			all.Set(k, v)
		}
	}
	if fv.Kind != "" && kindLabels[fv.Kind] == "" {
		data.Error = &errorPage{Title: "Bad filter", Message: "kind " + fv.Kind + " is not one of " + strings.Join(api.ToolKinds(), ", ")}
		p.renderPage(w, r, p.tools, "base.html", http.StatusBadRequest, data)
		return
	}
	c, err := p.opts.Catalog.List(r.Context(), all)
	if err != nil {
		var ce *api.CatalogError
		if errors.As(err, &ce) {
			title := "Bad filter"
			if ce.Status == http.StatusNotFound {
				title = "Not yours to ask about"
			}
			data.Error = &errorPage{Title: title, Message: ce.Message}
			p.renderPage(w, r, p.tools, "base.html", ce.Status, data)
			return
		}
		p.log.Warn("tools page: the catalog cannot be read", "err", err)
		data.Error = &errorPage{Title: "The tool registry cannot be read now", Message: "Retry in a moment; the recorder's log has the details."}
		p.renderPage(w, r, p.tools, "base.html", http.StatusServiceUnavailable, data)
		return
	}
	counts := map[string]int{}
	for _, t := range c.Tools {
		counts[t.Kind]++
		if fv.Kind != "" && t.Kind != fv.Kind {
			continue
		}
		data.Tools = append(data.Tools, toolViewOf(t))
	}
	for _, k := range api.ToolKinds() {
		u := url.Values{}
		for key, vs := range all {
			u[key] = vs
		}
		if k != fv.Kind {
			u.Set("kind", k) // the selected card's link clears the kind
		}
		data.Kinds = append(data.Kinds, kindCardView{Kind: k, Label: kindLabels[k], Count: counts[k], URL: "/tools?" + u.Encode()})
	}
	switch {
	case fv.OrgID != "":
		data.Tenant = tenantLabel(envelope.Tenant{OrgID: fv.OrgID, WorkspaceID: fv.WorkspaceID})
	case !pr.AllTenants():
		data.Tenant = tenantLabel(envelope.Tenant{OrgID: pr.OrgID, WorkspaceID: pr.WorkspaceID})
	}
	p.renderPage(w, r, p.tools, "base.html", http.StatusOK, data)
}

// toolViewOf is how the page shows t: its key status as the spec names it
// ("Missing API Key", "Using Workspace Key").
func toolViewOf(t apitypes.CatalogToolJSON) toolView {
	v := toolView{CatalogToolJSON: t, KindLabel: kindLabels[t.Kind], Auth: t.Auth.Status, Secrets: t.Auth.Secrets,
		Input: prettyJSON(t.InputSchema), Output: prettyJSON(t.OutputSchema), Timeout: (time.Duration(t.TimeoutMS) * time.Millisecond).String()}
	switch h := t.Health; h.Status {
	case apitypes.HealthUnavailable:
		v.HealthLabel, v.HealthTitle = "Unavailable", "every executor's circuit is open: calls fail at once"
		if h.OpenUntil != nil {
			v.HealthTitle += " until " + h.OpenUntil.UTC().Format(time.RFC3339)
		}
	case apitypes.HealthDegraded:
		v.HealthLabel, v.HealthTitle = "Degraded", fmt.Sprintf("%d consecutive failures (%s) on an executor", h.ConsecutiveFailures, h.LastFailure)
	default:
		v.HealthLabel, v.HealthTitle = "Healthy", "no executor counts a failure"
	}
	if rl := t.RateLimit; rl != nil {
		v.RateDetail = fmt.Sprintf("%s calls/s sustained, %d back to back, per tenant", strconv.FormatFloat(rl.PerS, 'g', 4, 64), rl.Burst)
		switch {
		case rl.ResetsAt != nil:
			v.RateLimited = true
			v.RateTitle = "no call may go now: the next may at " + rl.ResetsAt.UTC().Format("15:04:05 MST, 2 Jan")
			v.RateDetail += "; none left now, the next at " + rl.ResetsAt.UTC().Format("15:04:05 MST")
		case rl.Remaining != nil:
			v.RateDetail += fmt.Sprintf("; %d left now", *rl.Remaining)
		}
	}
	switch t.Auth.Status {
	case apitypes.AuthNone:
		v.AuthLabel, v.AuthTitle = "No key needed", "the tool needs no secret"
	case apitypes.AuthMissing:
		var missing []string
		for _, s := range t.Auth.Secrets {
			if s.Status == apitypes.AuthMissing {
				missing = append(missing, s.Name)
			}
		}
		v.AuthLabel, v.AuthTitle = "Missing API Key", "not set in any scope of the tenant: "+strings.Join(missing, ", ")
	case apitypes.AuthReady:
		v.AuthLabel, v.AuthTitle = "Ready", "every secret it needs is set"
		if t.Auth.Scope != "" {
			v.ScopeLabel = "Using " + strings.ToUpper(t.Auth.Scope[:1]) + t.Auth.Scope[1:] + " Key"
		}
		v.ScopeWarning = t.Auth.Warning
	default:
		v.AuthLabel, v.AuthTitle = "Key status unknown", "no tenant given: choose an org to see whether its keys are set"
	}
	return v
}
