package pages

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Limits of the pages' forms.
const (
	maxFormBytes   = 16 << 10
	maxNoteLen     = 2000
	sessionMaxAge  = 12 * time.Hour
	decideTimeout  = 10 * time.Second
	decisionSource = "/toolwire/recorder"
)

// csrfProtection refuses a state-changing request (POST) that a browser
// says comes from another origin: Sec-Fetch-Site other than same-origin or
// none, or else an Origin header whose host is not this server's. Requests
// without either header (curl, the CLI, API clients with bearer tokens) are
// not a browser's cross-site request and pass. This is Go's own defence
// (net/http, Go 1.25+): no token to thread through forms and fragments.
func csrfProtection() *http.CrossOriginProtection {
	c := http.NewCrossOriginProtection()
	c.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("cross-origin request refused: this form must be sent from the recorder's own pages\n"))
	}))
	return c
}

// userView is who the pages are shown to, in their header.
type userView struct {
	Name, Role, Tenant string
	CanLogout          bool
	// Admin: an admin of every tenant, who manages the registry.
	Admin bool
}

func userOf(r *http.Request) *userView {
	p := auth.FromContext(r.Context())
	if p.Role == "" {
		return nil
	}
	u := &userView{Name: p.Name, Role: string(p.Role), Tenant: "every tenant", CanLogout: p.Via != "none", Admin: isRegistryAdmin(p)}
	if !p.AllTenants() {
		u.Tenant = tenantLabel(envelope.Tenant{OrgID: p.OrgID, WorkspaceID: p.WorkspaceID})
	}
	return u
}

// loginView is the data of the login page.
type loginView struct {
	Title    string
	User     *userView
	Error    *errorPage
	Next     string
	Problem  string
	Required bool
}

// unauthenticated answers a page request without a valid session: the
// login page (401), or 503 when credentials cannot be checked now.
func (p *pages) unauthenticated(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, auth.ErrUnavailable) {
		p.pageError(w, r, http.StatusServiceUnavailable, "Credentials cannot be checked now; retry in a moment.")
		return
	}
	problem := ""
	if errors.Is(err, auth.ErrBadCredentials) {
		problem = "Your session is no longer valid (the token is unknown, revoked or expired). Sign in again."
	}
	next := r.URL.RequestURI()
	if r.Method != http.MethodGet || strings.HasSuffix(r.URL.Path, "/timeline") {
		next = "/"
	}
	p.renderLogin(w, r, http.StatusUnauthorized, next, problem)
}

func (p *pages) renderLogin(w http.ResponseWriter, r *http.Request, status int, next, problem string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="toolwire"`)
	p.renderPage(w, r, p.login, "base.html", status, loginView{Title: "Sign in", Next: safeNext(next), Problem: problem,
		Required: p.opts.Auth.Required(), User: userOf(r)})
}

// safeNext keeps a redirect on this server: a local path, never another
// host (//host, /\host) or scheme.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	if u, err := url.Parse(next); err != nil || u.Host != "" || u.Scheme != "" {
		return "/"
	}
	return next
}

func (p *pages) loginPage(w http.ResponseWriter, r *http.Request) {
	p.renderLogin(w, r, http.StatusOK, r.URL.Query().Get("next"), "")
}

// loginSubmit checks the token pasted and keeps it as the session cookie.
func (p *pages) loginSubmit(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.renderLogin(w, r, http.StatusBadRequest, "/", "The form could not be read.")
		return
	}
	next := r.PostForm.Get("next")
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	if tok == "" {
		p.renderLogin(w, r, http.StatusBadRequest, next, "Paste an API token (toolwire tokens create) or an OIDC ID token.")
		return
	}
	who, err := p.opts.Auth.Check(r.Context(), tok)
	if errors.Is(err, auth.ErrUnavailable) {
		p.renderLogin(w, r, http.StatusServiceUnavailable, next, "Credentials cannot be checked now; retry in a moment.")
		return
	}
	if err != nil {
		p.renderLogin(w, r, http.StatusUnauthorized, next, "That token is not valid here: unknown, revoked or expired.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: auth.SessionCookie, Value: tok, Path: "/", HttpOnly: true, Secure: p.secureCookie(r),
		SameSite: http.SameSiteLaxMode, MaxAge: int(sessionMaxAge.Seconds())})
	p.log.Info("web: signed in", "who", who.Name, "role", who.Role, "org", who.OrgID)
	http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
}

// secureCookie says whether the session cookie, which carries the bearer
// credential itself, is Secure (sent over HTTPS only). It is, always, but
// in two cases: Options.InsecureCookie says otherwise, or the browser is on
// plain HTTP at a loopback address, as with `toolwire dev` at
// http://127.0.0.1:8080: the request arrived without TLS, at a loopback
// Host, and the browser's own Origin (else its Referer) is http:// at a
// loopback host, so the cookie never leaves the machine. Behind a proxy that
// terminates TLS the browser's origin is https://, and the cookie Secure,
// whatever Host the proxy forwards.
func (p *pages) secureCookie(r *http.Request) bool {
	if p.opts.InsecureCookie {
		return false
	}
	if r.TLS != nil || !isLoopbackHost(r.Host) {
		return true
	}
	from := r.Header.Get("Origin")
	if from == "" || from == "null" {
		from = r.Referer()
	}
	u, err := url.Parse(from)
	if err != nil || u.Scheme != "http" || !isLoopbackHost(u.Host) {
		return true
	}
	return false
}

// isLoopbackHost reports whether host[:port] names the loopback interface:
// localhost, 127.0.0.0/8 or ::1.
func isLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (p *pages) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: auth.SessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: p.secureCookie(r),
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// decide applies an approver's decision from the timeline: it publishes the
// call's decided event, exactly as `toolwire approve|deny|revise` does (the
// Policy Guard applies it), signed with the approver's name; the timeline
// then shows who decided, when, and the note.
func (p *pages) decide(w http.ResponseWriter, r *http.Request) {
	runID, callID := r.PathValue("run_id"), r.PathValue("call_id")
	if events.ValidateRunID(runID) != nil || events.ValidateCallID(callID) != nil {
		p.pageError(w, r, http.StatusBadRequest, "Not a run id and call id.")
		return
	}
	who := auth.FromContext(r.Context())
	run, err := p.store.Run(r.Context(), runID)
	if err == nil && !who.Sees(run.Tenant) {
		err = store.ErrRunNotFound // not there for this reader
	}
	if p.runReadFailed(w, r, runID, err, "decide") {
		return
	}
	if !who.Can(auth.RoleApprover) {
		p.pageError(w, r, http.StatusForbidden, fmt.Sprintf("You are a %s: only an approver or an admin may decide approvals.", who.Role))
		return
	}
	if p.opts.JS == nil {
		p.pageError(w, r, http.StatusServiceUnavailable, "This recorder has no NATS connection to publish decisions on; use toolwire approve.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	note := strings.TrimSpace(r.PostForm.Get("note"))
	if len(note) > maxNoteLen {
		p.pageError(w, r, http.StatusBadRequest, fmt.Sprintf("A note is at most %d bytes.", maxNoteLen))
		return
	}
	d := events.Decision{RunID: runID, CallID: callID, Decision: events.DecisionKind(r.PostForm.Get("decision")), Note: note, By: who.Name}
	if err := d.Validate(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), decideTimeout)
	defer cancel()
	rec, err := approvals.PendingApproval(ctx, p.opts.JS, runID, callID)
	if err == nil && !who.Sees(rec.Call.Tenant) {
		err = fmt.Errorf("%w: call %s of run %s", approvals.ErrNoApproval, callID, runID)
	}
	if err == nil {
		err = approvals.PublishDecision(ctx, p.opts.JS, decisionSource, d, rec)
	}
	switch {
	case errors.Is(err, approvals.ErrNoApproval):
		p.pageError(w, r, http.StatusNotFound, "This call does not await approval.")
		return
	case errors.Is(err, approvals.ErrAlreadyDecided):
		p.pageError(w, r, http.StatusConflict, "Already decided: "+err.Error())
		return
	case err != nil:
		p.log.Error("decide", "run_id", runID, "call_id", callID, "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The decision could not be published now; retry, or use toolwire approve.")
		return
	}
	p.log.Info("web: approval decided", "run_id", runID, "call_id", callID, "decision", d.Decision, "by", who.Name)
	http.Redirect(w, r, "/runs/"+url.PathEscape(runID)+"#call-"+callID, http.StatusSeeOther)
}

// cancel cancels a run from the timeline's Cancel button: it publishes the
// run's cancel request exactly as POST /v1/runs/{run_id}/cancel and
// `toolwire cancel` do (api.Cancel), asked by the approver, for the run's
// tenant; the run then ends cancelled and the timeline shows it. Like the
// decision form it is a POST of this origin only (csrfProtection).
func (p *pages) cancel(w http.ResponseWriter, r *http.Request) {
	runID := r.PathValue("run_id")
	if events.ValidateRunID(runID) != nil {
		p.pageError(w, r, http.StatusBadRequest, "Not a run id.")
		return
	}
	who := auth.FromContext(r.Context())
	run, err := p.store.Run(r.Context(), runID)
	if err == nil && !who.Sees(run.Tenant) {
		err = store.ErrRunNotFound // not there for this reader
	}
	if p.runReadFailed(w, r, runID, err, "cancel") {
		return
	}
	if !who.Can(auth.RoleApprover) {
		p.pageError(w, r, http.StatusForbidden, fmt.Sprintf("You are a %s: only an approver or an admin may cancel a run here.", who.Role))
		return
	}
	if p.pub == nil {
		p.pageError(w, r, http.StatusServiceUnavailable, "This recorder has no NATS connection to publish the cancel on; use toolwire cancel.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.pageError(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	back := "/runs/" + url.PathEscape(runID)
	if store.IsTerminal(run.Status) {
		http.Redirect(w, r, back, http.StatusSeeOther) // nothing to cancel: the timeline shows its end
		return
	}
	err = api.Cancel(r.Context(), p.pub, run, who.Name, r.PostForm.Get("reason"))
	switch {
	case errors.Is(err, events.ErrInvalidCancel):
		p.pageError(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		p.log.Error("cancel", "run_id", runID, "err", err)
		p.pageError(w, r, http.StatusServiceUnavailable, "The cancel could not be published now; retry, or use toolwire cancel.")
		return
	}
	p.log.Info("web: run cancel requested", "run_id", runID, "by", who.Name)
	http.Redirect(w, r, back, http.StatusSeeOther)
}
