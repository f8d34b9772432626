package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/ratebucket"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// AdminTokenVar is the variable of the recorder's configuration that sets
// Options.AdminToken (recorder.EnvAdminToken): the admin routes' errors tell
// an operator to set it.
const AdminTokenVar = "TOOLWIRE_ADMIN_TOKEN" //nolint:gosec // G101: the name of a variable, not a credential

// maxDefinitionBytes bounds a registered definition.
const maxDefinitionBytes = 1 << 20

// toolCatalog serves the tool catalog of a tenant and the registry's admin
// routes. It reads the registry (and which secrets exist, never their
// values) from NATS on every request, so a change is visible at once;
// changes go through registry.Registry, the same path as `toolwire tools`.
//
//	GET  /v1/tools                        the catalog (?search= &category= &show_deprecated= &org_id= &workspace_id= &user_id=)
//	GET  /v1/admin/tools                  every entry, any state (?search= &category= &state=)
//	POST /v1/admin/tools                  register a definition (JSON): 201 new, 200 already registered the same, 409 changed
//	GET  /v1/admin/tools/{ref}            one entry (name@version)
//	PUT  /v1/admin/tools/{ref}/state      {"state": "active" | "deprecated" | "blocked"} (never back to draft)
//	POST /v1/admin/tools/{ref}/publish    a draft becomes active (POST /v1/admin/tools?draft=true registers one)
type toolCatalog struct {
	a *api

	mu  sync.Mutex
	reg *registry.Registry
}

// mountToolCatalog adds the catalog's routes to mux.
func (a *api) mountToolCatalog(mux *http.ServeMux) {
	c := &toolCatalog{a: a}
	mux.HandleFunc("GET /v1/tools", c.list)
	mux.HandleFunc("/v1/tools", a.methodNotAllowed)
	mux.HandleFunc("GET /v1/admin/tools", c.admin(c.adminList))
	mux.HandleFunc("POST /v1/admin/tools", c.admin(c.register))
	mux.HandleFunc("/v1/admin/tools", c.notAllowed("GET, POST"))
	mux.HandleFunc("GET /v1/admin/tools/{ref}", c.admin(c.get))
	mux.HandleFunc("/v1/admin/tools/{ref}", c.notAllowed("GET"))
	mux.HandleFunc("PUT /v1/admin/tools/{ref}/state", c.admin(c.setState))
	mux.HandleFunc("/v1/admin/tools/{ref}/state", c.notAllowed("PUT"))
	mux.HandleFunc("POST /v1/admin/tools/{ref}/publish", c.admin(c.publish))
	mux.HandleFunc("/v1/admin/tools/{ref}/publish", c.notAllowed("POST"))
}

func (c *toolCatalog) registry(ctx context.Context) (*registry.Registry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reg != nil {
		return c.reg, nil
	}
	if c.a.opts.JS == nil {
		return nil, errors.New("this recorder has no JetStream")
	}
	r, err := registry.Open(ctx, c.a.opts.JS)
	if err != nil {
		return nil, err
	}
	c.reg = r
	return r, nil
}

// open is the registry, or false once it wrote that it is unavailable.
func (c *toolCatalog) open(w http.ResponseWriter, r *http.Request) (*registry.Registry, bool) {
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return nil, false
	}
	return reg, true
}

// entries is every entry of the registry, or false once it wrote that the
// registry is unavailable.
func (c *toolCatalog) entries(w http.ResponseWriter, r *http.Request) ([]registry.Entry, bool) {
	reg, ok := c.open(w, r)
	if !ok {
		return nil, false
	}
	entries, err := reg.List(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return nil, false
	}
	return entries, true
}

func (c *toolCatalog) list(w http.ResponseWriter, r *http.Request) {
	out, err := c.catalog(r.Context(), r.URL.Query())
	if err != nil {
		var ce *CatalogError
		if errors.As(err, &ce) && ce.Status != http.StatusServiceUnavailable {
			writeError(w, ce.Status, ce.Code, ce.Message)
			return
		}
		c.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// CatalogError is a catalog request refused: its HTTP status, code and why.
type CatalogError struct {
	Status        int
	Code, Message string
}

func (e *CatalogError) Error() string { return e.Message }

// Catalog lists a tenant's tool catalog, as GET /v1/tools does, for the
// pages (the tools page) on the same server.
type Catalog struct{ c *toolCatalog }

// NewCatalog returns the catalog of js's tool registry (nil js: every
// listing is unavailable).
func NewCatalog(js jetstream.JetStream, log *slog.Logger) *Catalog {
	if log == nil {
		log = slog.Default()
	}
	return &Catalog{c: &toolCatalog{a: &api{opts: Options{JS: js}, log: log}}}
}

// List is GET /v1/tools for the principal of ctx, with the query's
// filters (search, category, kind, show_deprecated, org_id, workspace_id,
// user_id): a bad filter or a tenant the principal may not ask about is a
// *CatalogError; anything else means the registry or the secrets' names
// cannot be read now.
func (cat *Catalog) List(ctx context.Context, q url.Values) (apitypes.CatalogJSON, error) {
	return cat.c.catalog(ctx, q)
}

// catalog is the listing of GET /v1/tools.
func (c *toolCatalog) catalog(ctx context.Context, q url.Values) (apitypes.CatalogJSON, error) {
	bad := func(msg string) error {
		return &CatalogError{Status: http.StatusBadRequest, Code: apitypes.CodeInvalidParameter, Message: msg}
	}
	f, msg := parseListFilter(q)
	if msg != "" {
		return apitypes.CatalogJSON{}, bad(msg)
	}
	f.States = []registry.State{registry.StateActive}
	if v := q.Get("show_deprecated"); v != "" {
		show, err := strconv.ParseBool(v)
		if err != nil {
			return apitypes.CatalogJSON{}, bad(fmt.Sprintf("show_deprecated %q must be true or false", v))
		}
		if show {
			f.States = append(f.States, registry.StateDeprecated) // blocked: never listed
		}
	}
	var kind string
	if v := q.Get("kind"); v != "" {
		if !slices.Contains(ToolKinds(), v) {
			return apitypes.CatalogJSON{}, bad(fmt.Sprintf("kind %q is not one of %s", v, strings.Join(ToolKinds(), ", ")))
		}
		kind = v
	}
	tenant := envelope.Tenant{OrgID: q.Get("org_id"), WorkspaceID: q.Get("workspace_id"), UserID: q.Get("user_id")}
	if tenant.OrgID == "" && (tenant.WorkspaceID != "" || tenant.UserID != "") {
		return apitypes.CatalogJSON{}, bad("workspace_id and user_id need an org_id")
	}
	// Which secrets a tenant has is the tenant's: a principal bound to one
	// asks about its own (by default), never about another.
	if p := auth.FromContext(ctx); !p.AllTenants() {
		if tenant.OrgID == "" {
			tenant.OrgID = p.OrgID
		}
		if tenant.OrgID == p.OrgID && tenant.WorkspaceID == "" {
			tenant.WorkspaceID = p.WorkspaceID
		}
		if !p.Sees(tenant) {
			return apitypes.CatalogJSON{}, &CatalogError{Status: http.StatusNotFound, Code: apitypes.CodeNotFound,
				Message: fmt.Sprintf("no tenant %s/%s", tenant.OrgID, tenant.WorkspaceID)}
		}
	}
	reg, err := c.registry(ctx)
	if err != nil {
		return apitypes.CatalogJSON{}, err
	}
	entries, err := reg.List(ctx)
	if err != nil {
		return apitypes.CatalogJSON{}, err
	}
	entries = registry.Select(entries, f)
	if kind != "" {
		entries = slices.DeleteFunc(entries, func(e registry.Entry) bool { return ToolKind(e.Definition) != kind })
	}
	var located map[string]secrets.Level
	if tenant.OrgID != "" && needsSecrets(entries) {
		store, err := secrets.Open(ctx, c.a.opts.JS, nil)
		if err == nil {
			located, err = store.Locate(ctx, tenant)
		}
		if err != nil {
			return apitypes.CatalogJSON{}, err
		}
	}
	// The live processes of each queue, from their heartbeats.
	live := map[string][]apitypes.LiveWorkerJSON{}
	var ws []registry.Worker
	if len(entries) > 0 {
		if ws, err = registry.ListWorkers(ctx, c.a.opts.JS, time.Now()); err != nil {
			return apitypes.CatalogJSON{}, err
		}
		for _, w := range ws {
			live[w.Queue] = append(live[w.Queue], apitypes.LiveWorkerJSON{ID: w.ID, Remote: w.Remote, SeenAt: w.SeenAt})
		}
	}
	health := healthOf(ws, time.Now())
	rates := c.rateLimits(ctx, tenant)
	out := apitypes.CatalogJSON{Tools: make([]apitypes.CatalogToolJSON, 0, len(entries))}
	for _, e := range entries {
		d := e.Definition
		t := apitypes.CatalogToolJSON{
			Ref: d.Ref().String(), Name: d.Name, Version: d.Version, Description: d.Description,
			Category: d.Metadata.Category, SideEffects: d.Metadata.SideEffects, Kind: ToolKind(d), Queue: d.QueueName(),
			State: e.State, Deprecated: e.State == registry.StateDeprecated, RequiredScopes: orEmpty(d.RequiredScopes),
			Auth:        authStatus(d.RequiredSecrets, tenant.OrgID != "", located),
			InputSchema: d.InputSchema, OutputSchema: d.OutputSchema, Cache: d.Metadata.Cache, CacheTTLS: d.Metadata.CacheTTLS,
			TimeoutMS: int(d.Timeout().Milliseconds()), LiveWorkers: orNone(live[d.QueueName()]),
			Health: health(d.Ref().String()), RateLimit: rates(d),
		}
		out.Tools = append(out.Tools, t)
	}
	return out, nil
}

// rateLimits says where tenant stands in each tool's rate limit, from the
// executors' token buckets (toolwire_rate, read only). A bucket that cannot
// be read leaves the tenant's standing out (the limit is still shown): the
// catalog does not fail for it.
func (c *toolCatalog) rateLimits(ctx context.Context, tenant envelope.Tenant) func(d envelope.ToolDefinition) *apitypes.RateLimitStatusJSON {
	var (
		kv     jetstream.KeyValue
		opened bool
	)
	now := time.Now()
	return func(d envelope.ToolDefinition) *apitypes.RateLimitStatusJSON {
		lim := d.RateLimit
		if lim == nil {
			return nil
		}
		out := &apitypes.RateLimitStatusJSON{PerS: lim.PerS, Burst: lim.Burst}
		if tenant.OrgID == "" {
			return out
		}
		if !opened {
			opened = true
			var err error
			if kv, err = c.a.opts.JS.KeyValue(ctx, provision.BucketRate); err != nil {
				c.a.log.Warn("catalog: the rate limits cannot be read", "err", err)
			}
		}
		if kv == nil {
			return out
		}
		st := ratebucket.Full(lim)
		e, err := kv.Get(ctx, ratebucket.Key(tenant.ID(), d.Name))
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			c.a.log.Warn("catalog: a rate limit cannot be read", "tool", d.Name, "err", err)
			return out
		default:
			st = ratebucket.Decode(e.Value(), lim)
		}
		left := int(st.Refilled(lim, now).Tokens)
		out.Remaining = &left
		if wait := st.Wait(lim, now); wait > 0 {
			at := now.Add(wait).UTC().Truncate(time.Millisecond)
			out.ResetsAt = &at
		}
		return out
	}
}

// Tool kinds of the catalog: how a tool is run.
const (
	KindBuiltin = "builtin" // compiled into the executor
	KindHTTP    = "http"    // an HTTP endpoint the executor calls
	KindMCP     = "mcp"     // a tool of an MCP server
	KindSandbox = "sandbox" // code the sandbox service runs
	KindWorker  = "worker"  // a worker's own tool, on the worker's queue
)

// ToolKinds are the catalog's kinds, in the order the tools page shows them.
func ToolKinds() []string { return []string{KindBuiltin, KindHTTP, KindMCP, KindSandbox, KindWorker} }

// ToolKind is how d is run: a tool on a queue of its own is a worker's,
// else its implementation's kind.
func ToolKind(d envelope.ToolDefinition) string {
	if d.QueueName() != envelope.DefaultQueue {
		return KindWorker
	}
	return string(d.Implementation.Kind)
}

func needsSecrets(entries []registry.Entry) bool {
	for _, e := range entries {
		if len(e.Definition.RequiredSecrets) > 0 {
			return true
		}
	}
	return false
}

// levels from narrowest to broadest.
var levelRank = map[secrets.Level]int{secrets.LevelUser: 0, secrets.LevelWorkspace: 1, secrets.LevelOrg: 2}

func authStatus(required []string, haveTenant bool, located map[string]secrets.Level) apitypes.AuthStatusJSON {
	st := apitypes.AuthStatusJSON{Secrets: []apitypes.SecretStatusJSON{}}
	if len(required) == 0 {
		st.Status = apitypes.AuthNone
		return st
	}
	if !haveTenant {
		st.Status = apitypes.AuthUnknown
		for _, n := range required {
			st.Secrets = append(st.Secrets, apitypes.SecretStatusJSON{Name: n, Status: apitypes.AuthUnknown})
		}
		return st
	}
	st.Status = apitypes.AuthReady
	broadest := secrets.Level("")
	for _, n := range required {
		lvl, ok := located[n]
		if !ok {
			st.Status = apitypes.AuthMissing
			st.Secrets = append(st.Secrets, apitypes.SecretStatusJSON{Name: n, Status: apitypes.AuthMissing})
			continue
		}
		st.Secrets = append(st.Secrets, apitypes.SecretStatusJSON{Name: n, Status: apitypes.AuthReady, Scope: string(lvl)})
		if broadest == "" || levelRank[lvl] > levelRank[broadest] {
			broadest = lvl
		}
	}
	if st.Status == apitypes.AuthReady {
		st.Scope = string(broadest)
		if broadest == secrets.LevelOrg {
			st.Warning = "uses an org-scoped key: no user or workspace key is set"
		}
	}
	return st
}

// healthOf is each tool's health from the live executors' heartbeats
// (registry.HealthOf), as the catalog shows it.
func healthOf(ws []registry.Worker, now time.Time) func(ref string) apitypes.ToolHealthJSON {
	of := registry.HealthOf(ws, now)
	return func(ref string) apitypes.ToolHealthJSON {
		h := of(ref)
		out := apitypes.ToolHealthJSON{Status: string(h.Status), ConsecutiveFailures: h.ConsecutiveFailures, LastFailure: h.LastFailure}
		if !h.OpenUntil.IsZero() {
			until := h.OpenUntil
			out.OpenUntil = &until
		}
		return out
	}
}

func orNone(ws []apitypes.LiveWorkerJSON) []apitypes.LiveWorkerJSON {
	if ws == nil {
		return []apitypes.LiveWorkerJSON{}
	}
	return ws
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func parseCategory(v string) (envelope.Category, error) {
	switch c := envelope.Category(v); c {
	case envelope.CategoryAPI, envelope.CategoryCode, envelope.CategoryData, envelope.CategorySearch, envelope.CategoryUtility:
		return c, nil
	}
	return "", fmt.Errorf("category %q is not one of api, code, data, search, utility", v)
}

// listFilter reads what both listings take, ?search= and ?category=, or
// writes the error.
func listFilter(w http.ResponseWriter, q url.Values) (registry.Filter, bool) {
	f, msg := parseListFilter(q)
	if msg != "" {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, msg)
		return f, false
	}
	return f, true
}

// parseListFilter reads ?search= and ?category=; msg says what is wrong.
func parseListFilter(q url.Values) (f registry.Filter, msg string) {
	f = registry.Filter{Search: q.Get("search")}
	if v := q.Get("category"); v != "" {
		cat, err := parseCategory(v)
		if err != nil {
			return f, err.Error()
		}
		f.Category = cat
	}
	return f, ""
}

func badState(v string) string {
	return fmt.Sprintf("state %q is not one of active, deprecated, blocked, draft", v)
}

// admin guards an admin route: it needs an admin of every tenant (the
// registry is shared by all of them), that is the admin token or an API
// token or OIDC identity with role admin for org "*".
func (c *toolCatalog) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := auth.FromContext(r.Context())
		if p.Can(auth.RoleAdmin) && p.AllTenants() {
			h(w, r)
			return
		}
		if !c.a.opts.Auth.AdminConfigured() {
			writeError(w, http.StatusForbidden, apitypes.CodeAdminDisabled,
				"the registry admin API is off: set "+AdminTokenVar+" on the recorder and send it as a bearer token")
			return
		}
		if p.Via == "none" {
			// Authentication is off and the request carried no credentials.
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolwire admin"`)
			writeError(w, http.StatusUnauthorized, apitypes.CodeUnauthorized, "the admin API needs Authorization: Bearer <"+AdminTokenVar+">")
			return
		}
		writeError(w, http.StatusForbidden, apitypes.CodeForbidden,
			"the registry admin API needs an admin of every tenant: the admin token, or a token created with --role admin --org '*'")
	}
}

func (c *toolCatalog) notAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, apitypes.CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
	}
}

func (c *toolCatalog) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	c.a.log.Warn("tool catalog: registry unavailable", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable, "the tool registry cannot be read now; retry")
}

func (c *toolCatalog) adminList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, ok := listFilter(w, q)
	if !ok {
		return
	}
	if v := q.Get("state"); v != "" {
		st, err := registry.ParseState(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, badState(v))
			return
		}
		f.States = []registry.State{st}
	}
	entries, ok := c.entries(w, r)
	if !ok {
		return
	}
	out := apitypes.AdminToolsJSON{Tools: []apitypes.AdminToolJSON{}}
	for _, e := range registry.Select(entries, f) {
		out.Tools = append(out.Tools, apitypes.AdminToolJSON{Ref: e.Definition.Ref().String(), Entry: e})
	}
	writeJSON(w, http.StatusOK, out)
}

// refFailed writes the error of a registry call about ref, 404 when ref is
// not registered, and says whether there was one.
func (c *toolCatalog) refFailed(w http.ResponseWriter, r *http.Request, ref envelope.ToolRef, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, registry.ErrNotFound):
		writeError(w, http.StatusNotFound, apitypes.CodeToolNotFound, fmt.Sprintf("tool %s is not registered", ref))
	default:
		c.unavailable(w, r, err)
	}
	return true
}

// ref reads the {ref} path parameter, or writes the error.
func (c *toolCatalog) ref(w http.ResponseWriter, r *http.Request) (envelope.ToolRef, bool) {
	ref, err := envelope.ParseToolRef(r.PathValue("ref"))
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, err.Error())
		return ref, false
	}
	return ref, true
}

func (c *toolCatalog) get(w http.ResponseWriter, r *http.Request) {
	ref, ok := c.ref(w, r)
	if !ok {
		return
	}
	reg, ok := c.open(w, r)
	if !ok {
		return
	}
	e, err := reg.Get(r.Context(), ref)
	if c.refFailed(w, r, ref, err) {
		return
	}
	writeJSON(w, http.StatusOK, apitypes.AdminToolJSON{Ref: ref.String(), Entry: e})
}

func (c *toolCatalog) register(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDefinitionBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidTool, "the definition could not be read: "+err.Error())
		return
	}
	if len(body) > maxDefinitionBytes {
		writeError(w, http.StatusRequestEntityTooLarge, apitypes.CodeInvalidTool, fmt.Sprintf("a definition is at most %d bytes", maxDefinitionBytes))
		return
	}
	def, err := registry.DecodeDefinition(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidTool, err.Error())
		return
	}
	reg, ok := c.open(w, r)
	if !ok {
		return
	}
	register := reg.RegisterAs
	switch v := r.URL.Query().Get("draft"); v {
	case "", "false":
	case "true":
		register = reg.RegisterDraftAs
	default:
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, fmt.Sprintf("draft %q must be true or false", v))
		return
	}
	by := auth.FromContext(r.Context()).Name
	created, err := register(r.Context(), def, by)
	switch {
	case errors.Is(err, registry.ErrConflict):
		writeError(w, http.StatusConflict, apitypes.CodeToolConflict, err.Error())
		return
	case errors.Is(err, envelope.ErrInvalidTool):
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidTool, err.Error())
		return
	case err != nil:
		c.unavailable(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		c.a.log.Info("tool registered", "tool", def.Ref().String(), "by", by)
	}
	writeJSON(w, status, apitypes.RegisterJSON{Ref: def.Ref().String(), Created: created})
}

func (c *toolCatalog) setState(w http.ResponseWriter, r *http.Request) {
	ref, ok := c.ref(w, r)
	if !ok {
		return
	}
	var body apitypes.StateJSON
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, `the body must be {"state": "active" | "deprecated" | "blocked" | "draft"}: `+err.Error())
		return
	}
	if _, err := registry.ParseState(string(body.State)); err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, badState(string(body.State)))
		return
	}
	reg, ok := c.open(w, r)
	if !ok {
		return
	}
	by := auth.FromContext(r.Context()).Name
	if err := reg.SetStateAs(r.Context(), ref, body.State, by); errors.Is(err, envelope.ErrInvalidTool) {
		writeError(w, http.StatusConflict, apitypes.CodeToolConflict, err.Error())
		return
	} else if c.refFailed(w, r, ref, err) {
		return
	}
	c.a.log.Info("tool state changed", "tool", ref.String(), "state", body.State, "by", by)
	e, err := reg.Get(r.Context(), ref)
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.AdminToolJSON{Ref: ref.String(), Entry: e})
}

// publish is POST /v1/admin/tools/{ref}/publish: a draft becomes active
// (409 for a version that is not a draft).
func (c *toolCatalog) publish(w http.ResponseWriter, r *http.Request) {
	ref, ok := c.ref(w, r)
	if !ok {
		return
	}
	reg, ok := c.open(w, r)
	if !ok {
		return
	}
	by := auth.FromContext(r.Context()).Name
	if err := reg.Publish(r.Context(), ref, by); errors.Is(err, registry.ErrNotDraft) {
		writeError(w, http.StatusConflict, apitypes.CodeToolConflict, err.Error())
		return
	} else if c.refFailed(w, r, ref, err) {
		return
	}
	c.a.log.Info("tool published", "tool", ref.String(), "by", by)
	e, err := reg.Get(r.Context(), ref)
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apitypes.AdminToolJSON{Ref: ref.String(), Entry: e})
}
