package recorder

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// Environment variables read by ConfigFromEnv.
const (
	// EnvDatabaseURL sets Config.DatabaseURL: sqlite:<path> for a SQLite
	// file, or Postgres, as a URL
	// (postgres://user@host:5432/db?sslmode=disable) or a keyword/value string.
	EnvDatabaseURL = "DATABASE_URL"
	// EnvBatch sets Config.Batch.
	EnvBatch = "TOOLWIRE_RECORDER_BATCH"
	// EnvPoll sets Config.Poll: a duration such as 20ms, or 0 to have each
	// event pushed as it is stored.
	EnvPoll = "TOOLWIRE_RECORDER_POLL"
	// EnvAckWait sets Config.AckWait.
	EnvAckWait = "TOOLWIRE_RECORDER_ACK_WAIT"
	// EnvAdminToken sets Config.AdminToken.
	EnvAdminToken = api.AdminTokenVar
	// EnvDatabaseWait sets Config.DatabaseWait.
	EnvDatabaseWait = "TOOLWIRE_RECORDER_DATABASE_WAIT"
	// EnvAuth sets Config.AuthRequired: "on" or "off" (the default).
	EnvAuth = "TOOLWIRE_AUTH"
	// EnvInsecureNoAuth sets Config.InsecureNoAuth: 1 serves every tenant's
	// runs without authentication on a non-loopback address.
	EnvInsecureNoAuth = "TOOLWIRE_INSECURE_NO_AUTH"
	// EnvInsecureCookie sets Config.InsecureCookie: 1 sends the pages'
	// session cookie without Secure.
	EnvInsecureCookie = "TOOLWIRE_INSECURE_COOKIE"
	// EnvMCPStdio sets Config.MCPStdio: 1 lets the registry page start
	// stdio MCP servers to register their tools.
	EnvMCPStdio = "TOOLWIRE_RECORDER_MCP_STDIO"
	// EnvCORSOrigins sets Config.CORSOrigins: origins separated by commas.
	EnvCORSOrigins = "TOOLWIRE_RECORDER_CORS_ORIGINS"
	// The OIDC settings (Config.OIDC).
	EnvOIDCIssuer         = "TOOLWIRE_OIDC_ISSUER"
	EnvOIDCAudience       = "TOOLWIRE_OIDC_AUDIENCE"
	EnvOIDCOrgClaim       = "TOOLWIRE_OIDC_ORG_CLAIM"
	EnvOIDCWorkspaceClaim = "TOOLWIRE_OIDC_WORKSPACE_CLAIM"
	EnvOIDCRoleClaim      = "TOOLWIRE_OIDC_ROLE_CLAIM"
)

// Defaults of Config.
const (
	DefaultBatch = 1024
	maxBatch     = 4096
	// DefaultPoll is how often the recorder fetches the events waiting. Each
	// fetch is one transaction, and a transaction's fixed work (its advisory
	// locks, the gate's reads, the statements of every table touched, the
	// commit) is most of what the recorder costs Postgres when runs come one
	// at a time: measured with 1,000 one-call runs taken one at a time on two
	// CPUs shared with Postgres, 100ms instead of 20ms cut Postgres's CPU by
	// 55-65% and the pipeline's own by about 10%, and with them a one-call
	// run's p50 by 5-15% (the CPUs the services wait for are less often
	// busy with the recorder's writes). 250ms saved no more. It costs a live
	// timeline at most 80ms more before an event shows.
	DefaultPoll = 100 * time.Millisecond
	maxPoll     = 5 * time.Second
	// DefaultAckWait is the ack wait of the recorder's consumers. It bounds
	// how long an event whose delivery or acknowledgement was lost (a NATS
	// restart, a node's return, a replica killed mid-batch) waits before it
	// is delivered again: with JetStream's 30s it took the recorder 23-27s to
	// catch up after a NATS restart. A batch in hand never waits for it: the
	// runner extends its messages every third of it (InProgress) while they
	// are written, however long the database takes.
	DefaultAckWait = 5 * time.Second
	minAckWait     = time.Second
	maxAckWait     = 5 * time.Minute
	// DefaultDatabaseWait is how long Start waits for the database.
	DefaultDatabaseWait = 30 * time.Second
	minDatabaseWait     = time.Second
	maxDatabaseWait     = time.Hour
)

// ErrNoDatabase is returned when no database is configured.
var ErrNoDatabase = errors.New("recorder: " + EnvDatabaseURL + " is required: set it to a Postgres URL such as postgres://user@host:5432/toolwire?sslmode=disable, or to sqlite:<path> for a SQLite file")

// Config configures the recorder. Zero values mean the defaults.
type Config struct {
	// DatabaseURL is the Postgres connection string, or sqlite:<path>
	// (required: New refuses a config without it).
	DatabaseURL string
	// Batch is the most events written in one transaction. Under load the
	// recorder groups the events it holds into one commit; each is
	// acknowledged only after that commit. Each poll fetches up to Batch
	// events per stream (at most 512). Default 1024: with 256, a burst of
	// 840 one-call runs/s (13,000 events/s) left the recorder 0.4-0.9 s
	// behind after five seconds on two CPUs; with 1024, 20-30 ms.
	Batch int
	// Poll is how often the recorder fetches the events waiting (up to Batch
	// at once per stream), instead of having each event pushed to it as it
	// is stored: the recorder is off the agent loop's critical path, and
	// waking once per interval with a batch costs the services it shares a
	// server (and CPUs) with far less than a wake-up per event, and gives
	// the database bigger transactions. It adds at most Poll to the
	// recorder's lag. Zero means DefaultPoll; negative, push each event.
	Poll time.Duration
	// AckWait is how long a delivery may stay with the recorder without an
	// acknowledgement or an extension before JetStream delivers it again: the
	// recorder's recovery time after a delivery or an acknowledgement was
	// lost (a NATS restart). Events being written are extended every third
	// of it, so a slow database does not get them redelivered. Default
	// DefaultAckWait; 1s to 5m.
	AckWait time.Duration
	// AdminToken turns the registry's admin routes of the API on
	// (/v1/admin/tools): they then require it as a bearer token. "" leaves
	// them off. It authenticates as an admin of every tenant.
	AdminToken string
	// DatabaseWait bounds how long Start waits for the database to answer
	// (a database starting beside the recorder takes a few seconds); then
	// Start fails with what to check. Default 30s; 1s to 1h.
	DatabaseWait time.Duration
	// AuthRequired makes the API, the live stream, the blobs and the pages
	// require authentication (package auth): API tokens created with
	// `toolwire tokens create`, the admin token, and OIDC tokens when OIDC
	// is set; every read is then scoped to the caller's tenant. Setting an
	// OIDC issuer turns it on too.
	AuthRequired bool
	// StreamWait bounds how long a live stream opened before its run is
	// recorded waits for it. Zero: the API's default (30s); no environment
	// variable sets it (tests and embedders do).
	StreamWait time.Duration
	// OIDC accepts OpenID Connect ID tokens (Issuer and Audience set).
	OIDC auth.OIDCConfig
	// InsecureNoAuth allows serving without authentication on an address
	// other than loopback (CheckExposure): everyone who reaches the port
	// reads every tenant's runs. For a private network you trust, on
	// purpose; the recorder warns at every start.
	InsecureNoAuth bool
	// InsecureCookie sends the pages' session cookie, which carries the
	// credential itself, without Secure, so that browsers keep it over
	// plain HTTP: for a private network without TLS that you trust, on
	// purpose. Without it the cookie is Secure, except to a browser on
	// plain HTTP at a loopback address (`toolwire dev` at
	// http://127.0.0.1:...), where it never leaves the machine.
	InsecureCookie bool
	// CORSOrigins are the origins (scheme://host[:port]) whose pages may
	// embed the tool selector (<toolwire-tool-selector>, from
	// /assets/toolwire-tool-selector.js) and read GET /v1/tools with their
	// own bearer token; no other route answers another origin, and no
	// cookie crosses. None by default; "*" is refused.
	CORSOrigins []string
	// MCPStdio lets the registry page register a stdio MCP server: the
	// recorder then starts its command (without a shell, with PATH, HOME,
	// LANG, LC_ALL and TMPDIR only) to list its tools. Off by default: a
	// web form does not start programs on the recorder's host unless the
	// operator allows it; `toolwire tools mcp add --command` registers one
	// from the operator's own host. Streamable HTTP servers need nothing.
	MCPStdio bool
}

// Auth is the authentication the configuration asks for.
func (c Config) Auth() auth.Config {
	return auth.Config{Required: c.AuthRequired, AdminToken: c.AdminToken, OIDC: c.OIDC}
}

// ErrExposed is returned by CheckExposure.
var ErrExposed = errors.New("recorder: refusing to serve every tenant's runs without authentication")

// CheckExposure refuses to serve without authentication on an address other
// than loopback (addr is host:port; "" or a loopback host passes) unless
// InsecureNoAuth says so. `toolwire dev` listens on 127.0.0.1 and needs no
// configuration.
func CheckExposure(addr string, c Config) error {
	if addr == "" || c.Auth().On() || c.InsecureNoAuth || isLoopback(addr) {
		return nil
	}
	return fmt.Errorf("%w on %s, which is not a loopback address: set %s=on and create tokens with "+
		"`toolwire tokens create --org ORG --role viewer` (or set %s and %s for OpenID Connect), "+
		"listen on 127.0.0.1, or set %s=1 to serve without authentication anyway", ErrExposed, addr,
		EnvAuth, EnvOIDCIssuer, EnvOIDCAudience, EnvInsecureNoAuth)
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Poll = cmp.Or(c.Poll, DefaultPoll)
	c.DatabaseWait = cmp.Or(c.DatabaseWait, DefaultDatabaseWait)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, ErrNoDatabase)
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		errs = append(errs, fmt.Errorf("batch %d: want 1 to %d", c.Batch, maxBatch))
	}
	if c.Poll > maxPoll {
		errs = append(errs, fmt.Errorf("poll %s: want at most %s", c.Poll, maxPoll))
	}
	if c.AckWait < minAckWait || c.AckWait > maxAckWait {
		errs = append(errs, fmt.Errorf("ack wait %s: want %s to %s (%s)", c.AckWait, minAckWait, maxAckWait, EnvAckWait))
	}
	if c.DatabaseWait < minDatabaseWait || c.DatabaseWait > maxDatabaseWait {
		errs = append(errs, fmt.Errorf("database wait %s: want %s to %s", c.DatabaseWait, minDatabaseWait, maxDatabaseWait))
	}
	for _, o := range c.CORSOrigins {
		if err := validOrigin(o); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvCORSOrigins, err))
		}
	}
	if c.OIDC.Issuer != "" {
		if err := c.OIDC.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w (%s, %s)", err, EnvOIDCIssuer, EnvOIDCAudience))
		}
	} else if c.OIDC.Audience != "" {
		errs = append(errs, fmt.Errorf("%s is set without %s", EnvOIDCAudience, EnvOIDCIssuer))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment; unset
// variables take their defaults. Every bad value is reported at once.
// DATABASE_URL may be unset here (an option may fill it in): New refuses a
// configuration without it.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	e := service.NewEnv(getenv)
	e.String(EnvDatabaseURL, &c.DatabaseURL)
	e.Int(EnvBatch, 1, maxBatch, &c.Batch)
	if v, ok := e.Lookup(EnvPoll); ok {
		d, err := time.ParseDuration(v)
		switch {
		case v == "0":
			c.Poll = -1
		case err != nil || d <= 0 || d > maxPoll:
			e.Fail(EnvPoll, v, fmt.Sprintf("want a duration up to %s such as 20ms, or 0 to push each event", maxPoll))
		default:
			c.Poll = d
		}
	}
	e.Duration(EnvAckWait, minAckWait, maxAckWait, &c.AckWait)
	e.String(EnvAdminToken, &c.AdminToken)
	e.Duration(EnvDatabaseWait, minDatabaseWait, maxDatabaseWait, &c.DatabaseWait)
	mode := "off"
	e.Enum(EnvAuth, []string{"on", "off"}, &mode)
	c.AuthRequired = mode == "on"
	e.Bool(EnvInsecureNoAuth, &c.InsecureNoAuth)
	e.Bool(EnvInsecureCookie, &c.InsecureCookie)
	e.Bool(EnvMCPStdio, &c.MCPStdio)
	if v, ok := e.Lookup(EnvCORSOrigins); ok {
		for o := range strings.SplitSeq(v, ",") {
			if o = strings.TrimSpace(o); o == "" {
				continue
			}
			if err := validOrigin(o); err != nil {
				e.Fail(EnvCORSOrigins, v, err.Error())
				continue
			}
			c.CORSOrigins = append(c.CORSOrigins, strings.TrimSuffix(o, "/"))
		}
	}
	e.String(EnvOIDCIssuer, &c.OIDC.Issuer)
	e.String(EnvOIDCAudience, &c.OIDC.Audience)
	e.String(EnvOIDCOrgClaim, &c.OIDC.OrgClaim)
	e.String(EnvOIDCWorkspaceClaim, &c.OIDC.WorkspaceClaim)
	e.String(EnvOIDCRoleClaim, &c.OIDC.RoleClaim)
	return c.WithDefaults(), e.Err()
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvDatabaseURL, Help: "the recorder's database (required): a Postgres URL, or sqlite:<path> for a SQLite file (one recorder process)",
			Example: "postgres://toolwire@postgres:5432/toolwire?sslmode=disable"},
		{Name: EnvBatch, Help: "most events written in one transaction (1 to 4096; default 1024)", Example: "256"},
		{Name: EnvPoll, Help: "how often the recorder fetches the events waiting (up to 5s; default 100ms); 0 has each event pushed as it is stored",
			Example: "20ms"},
		{Name: EnvAckWait, Help: "how long an event delivered to the recorder may stay unacknowledged and not extended before it is delivered again: its recovery time after a NATS restart (1s to 5m; default 5s); events being written are extended every third of it",
			Example: "10s"},
		{Name: EnvAdminToken, Help: "turns the registry's admin routes (/v1/admin/tools) on; they require it as a bearer token (default: off); it is an admin of every tenant",
			Example: "an-admin-token"},
		{Name: EnvDatabaseWait, Help: "how long start-up waits for the database to answer before it fails saying what to check (1s to 1h; default 30s)",
			Example: "2m"},
		{Name: EnvAuth, Help: "on: the API, live stream, blobs and pages require a token (toolwire tokens create) and scope reads to its tenant (default off; off is refused on a non-loopback address)",
			Example: "on"},
		{Name: EnvInsecureNoAuth, Help: "1: serve without authentication on a non-loopback address anyway (everyone who reaches the port reads every tenant's runs)",
			Example: "1"},
		{Name: EnvInsecureCookie, Help: "1: the pages' session cookie is sent without Secure, for plain HTTP beyond loopback (default: Secure, but to a browser at http://127.0.0.1 or http://localhost)",
			Example: "1"},
		{Name: EnvMCPStdio, Help: "1: the registry page may register a stdio MCP server, which starts its command on the recorder's host to list its tools (default off: use toolwire tools mcp add --command; streamable HTTP servers need nothing)",
			Example: "1"},
		{Name: EnvCORSOrigins, Help: "origins (scheme://host[:port], comma-separated) whose pages may embed the tool selector web component and read GET /v1/tools with their own token; none by default",
			Example: "https://editor.example.com"},
		{Name: EnvOIDCIssuer, Help: "accept OpenID Connect ID tokens of this issuer as bearer tokens (turns authentication on; needs " + EnvOIDCAudience + ")",
			Example: "https://accounts.example.com"},
		{Name: EnvOIDCAudience, Help: "the client id OIDC tokens must be issued to", Example: "toolwire"},
		{Name: EnvOIDCOrgClaim, Help: "the OIDC claim naming the tenant's org (default org_id)", Example: "org"},
		{Name: EnvOIDCWorkspaceClaim, Help: "the OIDC claim naming the workspace (default workspace_id; absent: every workspace)", Example: "workspace"},
		{Name: EnvOIDCRoleClaim, Help: "the OIDC claim naming the role: viewer, producer, approver or admin, or a list of them (default toolwire_role)", Example: "groups"},
	}
}

// validOrigin checks that o is one web origin: http or https, a host, an
// optional port, nothing else ("*" and paths are refused).
func validOrigin(o string) error {
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.Contains(o, "*") {
		return fmt.Errorf("origin %q must be scheme://host[:port], http or https, with nothing after it", o)
	}
	return nil
}
