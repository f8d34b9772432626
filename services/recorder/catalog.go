package recorder

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/secrets"
)

// EnvAdminToken turns the registry's admin routes on: they require
// "Authorization: Bearer <token>". Unset, they answer 403.
const EnvAdminToken = "TOOLWIRE_ADMIN_TOKEN" //nolint:gosec // G101: the name of a variable, not a credential

// Error codes of the tool catalog and the admin routes.
const (
	CodeAdminDisabled = "admin_disabled"
	CodeUnauthorized  = "unauthorized"
	CodeInvalidTool   = "invalid_tool"
	CodeToolConflict  = "tool_conflict"
	CodeToolNotFound  = "tool_not_found"
)

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
//	PUT  /v1/admin/tools/{ref}/state      {"state": "active" | "deprecated" | "blocked"}
type toolCatalog struct {
	a     *api
	token string

	mu  sync.Mutex
	reg *registry.Registry
}

// mountToolCatalog adds the catalog's routes to mux.
func (a *api) mountToolCatalog(mux *http.ServeMux) {
	c := &toolCatalog{a: a, token: a.opts.AdminToken}
	mux.HandleFunc("GET /v1/tools", c.list)
	mux.HandleFunc("/v1/tools", a.methodNotAllowed)
	mux.HandleFunc("GET /v1/admin/tools", c.admin(c.adminList))
	mux.HandleFunc("POST /v1/admin/tools", c.admin(c.register))
	mux.HandleFunc("/v1/admin/tools", c.notAllowed("GET, POST"))
	mux.HandleFunc("GET /v1/admin/tools/{ref}", c.admin(c.get))
	mux.HandleFunc("/v1/admin/tools/{ref}", c.notAllowed("GET"))
	mux.HandleFunc("PUT /v1/admin/tools/{ref}/state", c.admin(c.setState))
	mux.HandleFunc("/v1/admin/tools/{ref}/state", c.notAllowed("PUT"))
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

// CatalogJSON is GET /v1/tools.
type CatalogJSON struct {
	Tools []CatalogToolJSON `json:"tools"`
}

// CatalogToolJSON is one tool version of the catalog: what a tool selector
// shows, with the tenant's auth status.
type CatalogToolJSON struct {
	Ref            string               `json:"ref"`
	Name           string               `json:"name"`
	Version        string               `json:"version"`
	Description    string               `json:"description"`
	Category       envelope.Category    `json:"category"`
	SideEffects    envelope.SideEffects `json:"side_effects"`
	State          registry.State       `json:"state"`
	Deprecated     bool                 `json:"deprecated"`
	RequiredScopes []string             `json:"required_scopes"`
	Auth           AuthStatusJSON       `json:"auth"`
}

// Auth statuses of a catalog tool.
const (
	AuthNone    = "none"    // the tool needs no secret
	AuthReady   = "ready"   // every secret it needs is set for the tenant
	AuthMissing = "missing" // some secret is set in none of the tenant's scopes
	AuthUnknown = "unknown" // no tenant was given
)

// AuthStatusJSON is a tool's auth status for a tenant: "ready" with the
// broadest scope its secrets come from (and a warning when that is the org
// scope), "missing", "none" or "unknown"; per secret, where it resolves.
// Secret values are never read: the recorder holds no master key.
type AuthStatusJSON struct {
	Status  string             `json:"status"`
	Scope   string             `json:"scope,omitempty"`
	Warning string             `json:"warning,omitempty"`
	Secrets []SecretStatusJSON `json:"secrets"`
}

// SecretStatusJSON is one secret of a tool: its name and the scope it
// resolves from, or "missing".
type SecretStatusJSON struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Scope  string `json:"scope,omitempty"`
}

func (c *toolCatalog) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := registry.Filter{Search: q.Get("search"), States: []registry.State{registry.StateActive}}
	if v := q.Get("category"); v != "" {
		cat, err := parseCategory(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, err.Error())
			return
		}
		f.Category = cat
	}
	if v := q.Get("show_deprecated"); v != "" {
		show, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, fmt.Sprintf("show_deprecated %q must be true or false", v))
			return
		}
		if show {
			f.States = append(f.States, registry.StateDeprecated) // blocked: never listed
		}
	}
	tenant := envelope.Tenant{OrgID: q.Get("org_id"), WorkspaceID: q.Get("workspace_id"), UserID: q.Get("user_id")}
	if tenant.OrgID == "" && (tenant.WorkspaceID != "" || tenant.UserID != "") {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, "workspace_id and user_id need an org_id")
		return
	}
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	entries, err := reg.List(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	entries = registry.Select(entries, f)
	var located map[string]secrets.Level
	if tenant.OrgID != "" && needsSecrets(entries) {
		store, err := secrets.Open(r.Context(), c.a.opts.JS, nil)
		if err == nil {
			located, err = store.Locate(r.Context(), tenant)
		}
		if err != nil {
			c.unavailable(w, r, err)
			return
		}
	}
	out := CatalogJSON{Tools: make([]CatalogToolJSON, 0, len(entries))}
	for _, e := range entries {
		d := e.Definition
		t := CatalogToolJSON{
			Ref: d.Ref().String(), Name: d.Name, Version: d.Version, Description: d.Description,
			Category: d.Metadata.Category, SideEffects: d.Metadata.SideEffects, State: e.State,
			Deprecated: e.State == registry.StateDeprecated, RequiredScopes: orEmpty(d.RequiredScopes),
			Auth: authStatus(d.RequiredSecrets, tenant.OrgID != "", located),
		}
		out.Tools = append(out.Tools, t)
	}
	writeJSON(w, http.StatusOK, out)
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

func authStatus(required []string, haveTenant bool, located map[string]secrets.Level) AuthStatusJSON {
	st := AuthStatusJSON{Secrets: []SecretStatusJSON{}}
	if len(required) == 0 {
		st.Status = AuthNone
		return st
	}
	if !haveTenant {
		st.Status = AuthUnknown
		for _, n := range required {
			st.Secrets = append(st.Secrets, SecretStatusJSON{Name: n, Status: AuthUnknown})
		}
		return st
	}
	st.Status = AuthReady
	broadest := secrets.Level("")
	for _, n := range required {
		lvl, ok := located[n]
		if !ok {
			st.Status = AuthMissing
			st.Secrets = append(st.Secrets, SecretStatusJSON{Name: n, Status: AuthMissing})
			continue
		}
		st.Secrets = append(st.Secrets, SecretStatusJSON{Name: n, Status: AuthReady, Scope: string(lvl)})
		if broadest == "" || levelRank[lvl] > levelRank[broadest] {
			broadest = lvl
		}
	}
	if st.Status == AuthReady {
		st.Scope = string(broadest)
		if broadest == secrets.LevelOrg {
			st.Warning = "uses an org-scoped key: no user or workspace key is set"
		}
	}
	return st
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

// admin guards an admin route with the bearer token.
func (c *toolCatalog) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.token == "" {
			writeError(w, http.StatusForbidden, CodeAdminDisabled,
				"the registry admin API is off: set "+EnvAdminToken+" on the recorder and send it as a bearer token")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(c.token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolwire admin"`)
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, "the admin API needs Authorization: Bearer <"+EnvAdminToken+">")
			return
		}
		h(w, r)
	}
}

func (c *toolCatalog) notAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
	}
}

func (c *toolCatalog) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	c.a.log.Warn("tool catalog: registry unavailable", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the tool registry cannot be read now; retry")
}

// AdminToolJSON is a registry entry as the admin routes show it.
type AdminToolJSON struct {
	Ref string `json:"ref"`
	registry.Entry
}

// AdminToolsJSON is GET /v1/admin/tools.
type AdminToolsJSON struct {
	Tools []AdminToolJSON `json:"tools"`
}

func (c *toolCatalog) adminList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := registry.Filter{Search: q.Get("search")}
	if v := q.Get("category"); v != "" {
		cat, err := parseCategory(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, err.Error())
			return
		}
		f.Category = cat
	}
	if v := q.Get("state"); v != "" {
		st, err := registry.ParseState(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidParameter, fmt.Sprintf("state %q is not one of active, deprecated, blocked", v))
			return
		}
		f.States = []registry.State{st}
	}
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	entries, err := reg.List(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	out := AdminToolsJSON{Tools: []AdminToolJSON{}}
	for _, e := range registry.Select(entries, f) {
		out.Tools = append(out.Tools, AdminToolJSON{Ref: e.Definition.Ref().String(), Entry: e})
	}
	writeJSON(w, http.StatusOK, out)
}

// ref reads the {ref} path parameter, or writes the error.
func (c *toolCatalog) ref(w http.ResponseWriter, r *http.Request) (envelope.ToolRef, bool) {
	ref, err := envelope.ParseToolRef(r.PathValue("ref"))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, err.Error())
		return ref, false
	}
	return ref, true
}

func (c *toolCatalog) get(w http.ResponseWriter, r *http.Request) {
	ref, ok := c.ref(w, r)
	if !ok {
		return
	}
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	e, err := reg.Get(r.Context(), ref)
	if errors.Is(err, registry.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeToolNotFound, fmt.Sprintf("tool %s is not registered", ref))
		return
	}
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, AdminToolJSON{Ref: ref.String(), Entry: e})
}

// RegisterJSON is the answer to POST /v1/admin/tools.
type RegisterJSON struct {
	Ref     string `json:"ref"`
	Created bool   `json:"created"`
}

func (c *toolCatalog) register(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDefinitionBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidTool, "the definition could not be read: "+err.Error())
		return
	}
	if len(body) > maxDefinitionBytes {
		writeError(w, http.StatusRequestEntityTooLarge, CodeInvalidTool, fmt.Sprintf("a definition is at most %d bytes", maxDefinitionBytes))
		return
	}
	def, err := registry.DecodeDefinition(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidTool, err.Error())
		return
	}
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	created, err := reg.Register(r.Context(), def)
	switch {
	case errors.Is(err, registry.ErrConflict):
		writeError(w, http.StatusConflict, CodeToolConflict, err.Error())
		return
	case errors.Is(err, envelope.ErrInvalidTool):
		writeError(w, http.StatusBadRequest, CodeInvalidTool, err.Error())
		return
	case err != nil:
		c.unavailable(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		c.a.log.Info("tool registered", "tool", def.Ref().String())
	}
	writeJSON(w, status, RegisterJSON{Ref: def.Ref().String(), Created: created})
}

// StateJSON is the body of PUT /v1/admin/tools/{ref}/state.
type StateJSON struct {
	State registry.State `json:"state"`
}

func (c *toolCatalog) setState(w http.ResponseWriter, r *http.Request) {
	ref, ok := c.ref(w, r)
	if !ok {
		return
	}
	var body StateJSON
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, `the body must be {"state": "active" | "deprecated" | "blocked"}: `+err.Error())
		return
	}
	if _, err := registry.ParseState(string(body.State)); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidParameter, fmt.Sprintf("state %q is not one of active, deprecated, blocked", body.State))
		return
	}
	reg, err := c.registry(r.Context())
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	err = reg.SetState(r.Context(), ref, body.State)
	if errors.Is(err, registry.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeToolNotFound, fmt.Sprintf("tool %s is not registered", ref))
		return
	}
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	c.a.log.Info("tool state changed", "tool", ref.String(), "state", body.State)
	e, err := reg.Get(r.Context(), ref)
	if err != nil {
		c.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, AdminToolJSON{Ref: ref.String(), Entry: e})
}

// adminToken reads EnvAdminToken.
func adminToken(getenv func(string) string) string {
	if getenv == nil {
		return ""
	}
	return strings.TrimSpace(getenv(EnvAdminToken))
}
