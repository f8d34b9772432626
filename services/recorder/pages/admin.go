package pages

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// --- the registry page (admins) ---

// isRegistryAdmin: the registry is every tenant's, so only an admin of
// every tenant manages it (as GET /v1/admin/tools).
func isRegistryAdmin(p auth.Principal) bool { return p.Can(auth.RoleAdmin) && p.AllTenants() }

type adminPage struct {
	Title       string
	User        *userView
	Error       *errorPage
	Notice      string
	Problem     string
	Form        registerForm
	MCP         mcpForm
	MCPProblem  string
	MCPStdio    bool
	Entries     []adminEntryView
	States      []registry.State
	Categories  []envelope.Category
	SideEffects []envelope.SideEffects
	Methods     []string
}

type adminEntryView struct {
	Ref, Description, Kind string
	State                  registry.State
	// States are those the version may be moved to (a published version
	// never becomes a draft again).
	States   []registry.State
	When, By string
	History  []historyView
}

type historyView struct {
	State    registry.State
	When, By string
}

// registerForm is what the create dialog holds, kept when it is refused.
type registerForm struct {
	Name, Version, Description string
	Category                   envelope.Category
	SideEffects                envelope.SideEffects
	Method, URL                string
	SecretHeaders, InputSchema string
	OutputSchema               string
	TimeoutMS                  string
	Draft                      bool
}

// registry is the pages' registry handle; false once it wrote why not.
func (p *pages) registry(w http.ResponseWriter, r *http.Request) (*registry.Registry, bool) {
	if !isRegistryAdmin(auth.FromContext(r.Context())) {
		p.pageError(w, r, http.StatusForbidden, "Admins only: the registry is every tenant's: it is managed by an admin of every tenant (the admin token, or a token with role admin for org *).")
		return nil, false
	}
	if p.opts.JS == nil {
		p.pageError(w, r, http.StatusServiceUnavailable, "No tool registry: this recorder has no NATS connection to the registry.")
		return nil, false
	}
	reg, err := registry.Open(r.Context(), p.opts.JS)
	if err != nil {
		p.log.Warn("registry page: the registry cannot be opened", "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The tool registry cannot be read now; retry in a moment.")
		return nil, false
	}
	return reg, true
}

func (p *pages) adminPage(w http.ResponseWriter, r *http.Request) {
	reg, ok := p.registry(w, r)
	if !ok {
		return
	}
	form := registerForm{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Method: envelope.DefaultHTTPMethod,
		InputSchema: `{"type": "object", "properties": {}}`}
	notice := ""
	if ref := r.URL.Query().Get("registered"); ref != "" {
		notice = "Registered " + ref + ": it is active, and every tenant's catalog lists it."
		if r.URL.Query().Get("draft") == "true" {
			notice = "Registered " + ref + " as a draft: no catalog lists it and no run may call it until it is published."
		}
	}
	if ref := r.URL.Query().Get("published"); ref != "" {
		notice = "Published " + ref + ": it is active, and every tenant's catalog lists it."
	}
	if ref := r.URL.Query().Get("changed"); ref != "" {
		notice = ref + " is now " + r.URL.Query().Get("state") + "."
	}
	if srv := r.URL.Query().Get("mcp"); srv != "" {
		notice = fmt.Sprintf("Registered %s tools of MCP server %s: they are active, and every tenant's catalog lists them.", r.URL.Query().Get("tools"), srv)
		if sk := r.URL.Query().Get("skipped"); sk != "" && sk != "0" {
			notice += " " + sk + " of its tools could not be registered (the CLI's --dry-run says why)."
		}
	}
	p.renderAdmin(w, r, reg, http.StatusOK, form, notice, "")
}

func (p *pages) renderAdmin(w http.ResponseWriter, r *http.Request, reg *registry.Registry, status int, form registerForm, notice, problem string) {
	p.renderAdminPage(w, r, reg, status, adminPage{Notice: notice, Problem: problem, Form: form, MCP: newMCPForm()})
}

// renderAdminPage renders data (its notices and forms) with the registry's
// entries.
func (p *pages) renderAdminPage(w http.ResponseWriter, r *http.Request, reg *registry.Registry, status int, data adminPage) {
	entries, err := reg.List(r.Context())
	if err != nil {
		p.log.Warn("registry page: the registry cannot be listed", "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The tool registry cannot be read now; retry in a moment.")
		return
	}
	data.Title, data.User, data.MCPStdio = "Registry", userOf(r), p.opts.MCPStdio
	data.States = []registry.State{registry.StateActive, registry.StateDeprecated, registry.StateBlocked}
	data.Categories = []envelope.Category{envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility}
	data.SideEffects = []envelope.SideEffects{envelope.SideEffectsNone, envelope.SideEffectsReads, envelope.SideEffectsWrites}
	data.Methods = []string{"POST", "PUT", "PATCH"}
	if data.Form.Method == "" {
		data.Form = registerForm{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Method: envelope.DefaultHTTPMethod,
			InputSchema: `{"type": "object", "properties": {}}`}
	}
	for _, e := range entries {
		v := adminEntryView{Ref: e.Definition.Ref().String(), Description: e.Definition.Description, Kind: kindLabels[api.ToolKind(e.Definition)],
			State: e.State, When: e.UpdatedAt.UTC().Format("2006-01-02 15:04:05"), By: e.UpdatedBy, States: data.States}
		if e.State == registry.StateDraft {
			v.States = append([]registry.State{registry.StateDraft}, data.States...)
		}
		if hist, err := reg.History(r.Context(), e.Definition.Ref()); err == nil && len(hist) > 1 {
			for _, h := range hist {
				v.History = append(v.History, historyView{State: h.State, When: h.UpdatedAt.UTC().Format("2006-01-02 15:04:05"), By: h.UpdatedBy})
			}
		}
		data.Entries = append(data.Entries, v)
	}
	p.renderPage(w, r, p.admin, "base.html", status, data)
}

// register is the create dialog's POST: the definition it builds is checked
// as `toolwire tools register` checks a file (registry.DecodeDefinition), and
// registered by the admin's name.
func (p *pages) register(w http.ResponseWriter, r *http.Request) {
	reg, ok := p.registry(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 256<<10)
	if err := r.ParseForm(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, "Bad form: "+err.Error())
		return
	}
	f := registerForm{Name: strings.TrimSpace(r.PostForm.Get("name")), Version: strings.TrimSpace(r.PostForm.Get("version")),
		Description: strings.TrimSpace(r.PostForm.Get("description")), Category: envelope.Category(r.PostForm.Get("category")),
		SideEffects: envelope.SideEffects(r.PostForm.Get("side_effects")), Method: r.PostForm.Get("method"),
		URL: strings.TrimSpace(r.PostForm.Get("url")), SecretHeaders: r.PostForm.Get("secret_headers"),
		InputSchema: r.PostForm.Get("input_schema"), OutputSchema: r.PostForm.Get("output_schema"), Draft: r.PostForm.Get("draft") == "true", TimeoutMS: strings.TrimSpace(r.PostForm.Get("timeout_ms"))}
	def, err := f.definition()
	if err == nil {
		var b []byte
		if b, err = json.Marshal(def); err == nil {
			def, err = registry.DecodeDefinition(b)
		}
	}
	if err != nil {
		p.renderAdmin(w, r, reg, http.StatusUnprocessableEntity, f, "", "Not registered: "+err.Error())
		return
	}
	by := auth.FromContext(r.Context()).Name
	register := reg.RegisterAs
	if f.Draft {
		register = reg.RegisterDraftAs
	}
	created, err := register(r.Context(), def, by)
	switch {
	case errors.Is(err, registry.ErrConflict), errors.Is(err, envelope.ErrInvalidTool):
		p.renderAdmin(w, r, reg, http.StatusConflict, f, "", "Not registered: "+err.Error())
		return
	case err != nil:
		p.log.Warn("registry page: register", "tool", def.Ref().String(), "err", err)
		p.renderAdmin(w, r, reg, http.StatusServiceUnavailable, f, "", "Not registered: the registry cannot be written now; retry.")
		return
	}
	if created {
		p.log.Info("tool registered", "tool", def.Ref().String(), "by", by, "via", "registry page")
	}
	q := url.Values{"registered": {def.Ref().String()}}
	if f.Draft {
		q.Set("draft", "true")
	}
	http.Redirect(w, r, "/admin/tools?"+q.Encode(), http.StatusSeeOther)
}

// definition is the HTTP tool the form describes.
func (f registerForm) definition() (envelope.ToolDefinition, error) {
	cfg := envelope.HTTPConfig{URL: f.URL, Method: f.Method}
	var secrets []string
	for i, line := range strings.Split(strings.ReplaceAll(f.SecretHeaders, "\r\n", "\n"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		header, secret, ok := strings.Cut(line, ":")
		header, secret = strings.TrimSpace(header), strings.TrimSpace(secret)
		if !ok || header == "" || secret == "" {
			return envelope.ToolDefinition{}, fmt.Errorf("headers from secrets, line %d: want Header: SECRET_NAME, not %q", i+1, line)
		}
		if cfg.SecretHeaders == nil {
			cfg.SecretHeaders = map[string]string{}
		}
		cfg.SecretHeaders[header] = "{{secret:" + secret + "}}"
		secrets = append(secrets, secret)
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		return envelope.ToolDefinition{}, err
	}
	schema := strings.TrimSpace(f.InputSchema)
	if !json.Valid([]byte(schema)) {
		return envelope.ToolDefinition{}, errors.New("the input schema is not JSON")
	}
	def := envelope.ToolDefinition{Name: f.Name, Version: f.Version, Description: f.Description, InputSchema: json.RawMessage(schema),
		Metadata:       envelope.ToolMetadata{Category: f.Category, SideEffects: f.SideEffects, Cache: envelope.CacheNone},
		Implementation: envelope.Implementation{Kind: envelope.ImplHTTP, Config: config}, RequiredSecrets: secrets,
		// The executor previews every http tool: the request it would send.
		SupportsPreview: true}
	if out := strings.TrimSpace(f.OutputSchema); out != "" {
		if !json.Valid([]byte(out)) {
			return envelope.ToolDefinition{}, errors.New("the output schema is not JSON")
		}
		def.OutputSchema = json.RawMessage(out)
	}
	if f.TimeoutMS != "" {
		ms, err := strconv.Atoi(f.TimeoutMS)
		if err != nil || ms <= 0 {
			return envelope.ToolDefinition{}, fmt.Errorf("timeout %q must be a number of milliseconds above 0", f.TimeoutMS)
		}
		def.TimeoutMS = ms
	}
	return def, nil
}

// setState is a registry row's POST: the version's new state, by the
// admin's name.
func (p *pages) setState(w http.ResponseWriter, r *http.Request) {
	reg, ok := p.registry(w, r)
	if !ok {
		return
	}
	ref, err := envelope.ParseToolRef(r.PathValue("ref"))
	if err != nil {
		p.pageError(w, r, http.StatusBadRequest, "Bad tool: "+err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	st, err := registry.ParseState(r.FormValue("state"))
	if err != nil {
		p.pageError(w, r, http.StatusBadRequest, "Bad state: "+err.Error())
		return
	}
	by := auth.FromContext(r.Context()).Name
	if err := reg.SetStateAs(r.Context(), ref, st, by); errors.Is(err, envelope.ErrInvalidTool) {
		p.renderAdmin(w, r, reg, http.StatusConflict, registerForm{}, "", "Not changed: "+err.Error())
		return
	} else if errors.Is(err, registry.ErrNotFound) {
		p.pageError(w, r, http.StatusNotFound, "No such tool: "+err.Error())
		return
	} else if err != nil {
		p.log.Warn("registry page: set state", "tool", ref.String(), "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The registry cannot be written now; retry in a moment.")
		return
	}
	p.log.Info("tool state changed", "tool", ref.String(), "state", st, "by", by, "via", "registry page")
	http.Redirect(w, r, "/admin/tools?changed="+url.QueryEscape(ref.String())+"&state="+url.QueryEscape(string(st)), http.StatusSeeOther)
}

// publish is a draft's Publish button: the version becomes active, by the
// admin's name.
func (p *pages) publish(w http.ResponseWriter, r *http.Request) {
	reg, ok := p.registry(w, r)
	if !ok {
		return
	}
	ref, err := envelope.ParseToolRef(r.PathValue("ref"))
	if err != nil {
		p.pageError(w, r, http.StatusBadRequest, "Bad tool: "+err.Error())
		return
	}
	by := auth.FromContext(r.Context()).Name
	switch err := reg.Publish(r.Context(), ref, by); {
	case errors.Is(err, registry.ErrNotFound):
		p.pageError(w, r, http.StatusNotFound, "No such tool: "+err.Error())
		return
	case errors.Is(err, registry.ErrNotDraft):
		p.renderAdmin(w, r, reg, http.StatusConflict, registerForm{}, "", "Not published: "+err.Error())
		return
	case err != nil:
		p.log.Warn("registry page: publish", "tool", ref.String(), "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The registry cannot be written now; retry in a moment.")
		return
	}
	p.log.Info("tool published", "tool", ref.String(), "by", by, "via", "registry page")
	http.Redirect(w, r, "/admin/tools?published="+url.QueryEscape(ref.String()), http.StatusSeeOther)
}
