package web

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Environment variables of the web tools (the executor's ConfigFromEnv reads
// them into its Config.Web).
const (
	// EnvAllowHosts lists host[:port] entries, comma-separated, that the
	// web tools may reach although the SSRF guard refuses their addresses
	// (an internal API an operator trusts; a test server on 127.0.0.1).
	EnvAllowHosts = "TOOLWIRE_HTTP_ALLOW_HOSTS"
	// EnvMaxResponseBytes caps the bytes of a response body the web tools
	// read; the rest is dropped and the output says truncated.
	EnvMaxResponseBytes = "TOOLWIRE_HTTP_MAX_RESPONSE_BYTES"
)

// Defaults and limits of Config.
const (
	// MaxResponseBytesLimit bounds Config.MaxResponseBytes (64 MiB).
	MaxResponseBytesLimit   = 64 << 20
	DefaultMaxResponseBytes = 2 << 20
	DefaultMaxRedirects     = 5
	DefaultRequestTimeout   = 30 * time.Second
	defaultDialTimeout      = 10 * time.Second
	// errorBodyPreview bounds the body quoted in an error's details.
	errorBodyPreview = 1024
	// UserAgent is the User-Agent of every request of the HTTP tools that
	// does not set its own.
	UserAgent = "toolwire/1.0 (+https://toolwire.dev)"
)

// Config configures the web tools (http_request, http_get, web_fetch).
// Zero fields take their defaults.
type Config struct {
	// AllowHosts are host[:port] entries the operator trusts: the SSRF guard
	// lets the web tools reach them even on a loopback or private address.
	// A name matches the URL's host as written; an IP address matches the
	// address dialled.
	AllowHosts []string
	// MaxResponseBytes caps a response body (default 2 MiB).
	MaxResponseBytes int64
	// MaxRedirects caps the redirects followed (default 5).
	MaxRedirects int
	// RequestTimeout caps one request, redirects and body included (default
	// 30s); the tool's own timeout still applies when shorter. Its expiry is
	// TIMEOUT naming it.
	RequestTimeout time.Duration
	// Resolver resolves host names; nil is the system's (a test can map
	// names to addresses).
	Resolver HostResolver
}

func (c Config) withDefaults() Config {
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	c.MaxRedirects = cmp.Or(c.MaxRedirects, DefaultMaxRedirects)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	return c
}

// Validate checks the settings.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if _, err := parseAllowHosts(strings.Join(c.AllowHosts, ",")); err != nil {
		errs = append(errs, err)
	}
	if c.MaxResponseBytes < 1 || c.MaxResponseBytes > MaxResponseBytesLimit {
		errs = append(errs, fmt.Errorf("max response bytes %d: want 1 to %d", c.MaxResponseBytes, MaxResponseBytesLimit))
	}
	if c.MaxRedirects < 0 || c.MaxRedirects > 20 {
		errs = append(errs, fmt.Errorf("max redirects %d: want 0 to 20", c.MaxRedirects))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, errors.New("request timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// Client is the SSRF-guarded HTTP client the web tools share.
type Client struct {
	cfg    Config
	dialer *guardedDialer
	// transport is kept to close idle connections at Stop.
	transport *http.Transport
}

func NewClient(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("web tools: %w", err)
	}
	allow, err := parseAllowHosts(strings.Join(cfg.AllowHosts, ","))
	if err != nil {
		return nil, err
	}
	d := newGuardedDialer(allow, cfg.Resolver, defaultDialTimeout)
	tr := &http.Transport{
		// Never a proxy from the environment: a proxy would dial for us,
		// out of the guard's sight.
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// No ResponseHeaderTimeout: every request is bounded by its context
		// (a web tool's RequestTimeout, an http tool's own timeout), which
		// runs from before the dial; a transport-wide wait for headers would
		// cut an http tool whose timeout is longer than RequestTimeout.
		MaxIdleConns:           64,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
	return &Client{cfg: cfg, dialer: d, transport: tr}, nil
}

// Close drops idle connections; the client stays usable.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

// tooManyRedirectsError stops a redirect chain.
type tooManyRedirectsError struct{ max int }

func (e *tooManyRedirectsError) Error() string {
	return fmt.Sprintf("stopped after %d redirects", e.max)
}

// Request is one request a tool sends through the Client.
type Request struct {
	// Tool names the tool in error messages.
	Tool string
	// HTTP is the request; its context bounds it, body included.
	HTTP *http.Request
	// SecretHeaders are the headers that carry secrets (BuildHeaders). Each
	// goes only where Bindings lets every secret it holds go, and is dropped
	// when a redirect leaves the first request's scheme, host and port.
	SecretHeaders []SecretHeader
	// Bindings say where each secret may be sent: a secret header whose
	// secret has no binding, or whose binding names neither the request's
	// destination nor the header, refuses the request with POLICY_DENIED
	// before anything is sent (secretdest.go).
	Bindings map[string]envelope.SecretBinding
	// NoRedirects returns a redirect response as it is, unfollowed.
	NoRedirects bool
}

// client returns an http.Client for r. The headers of r.SecretHeaders are
// dropped when a redirect leaves the first request's scheme, host and port,
// so a secret never follows a redirect elsewhere; those a hop keeps are
// checked against r.Bindings again before it is sent.
func (c *Client) client(r Request) *http.Client {
	return &http.Client{
		Transport: c.transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if r.NoRedirects {
				return http.ErrUseLastResponse
			}
			if len(via) > c.cfg.MaxRedirects {
				return &tooManyRedirectsError{max: c.cfg.MaxRedirects}
			}
			if !sameOrigin(req.URL, via[0].URL) {
				for _, h := range r.SecretHeaders {
					req.Header.Del(h.Name)
				}
				return nil
			}
			return checkSecretDestinations(req.URL, r.SecretHeaders, r.Bindings)
		},
	}
}

// Do sends r through the SSRF guard, reads the response's body (at most
// MaxResponseBytes; truncated says more followed) and closes it. A failure
// is the tool's error, as classifyTransportError maps it: POLICY_DENIED for
// a secret header its bindings do not let go to the destination and for a
// destination the guard refuses, NETWORK_ERROR for DNS and connection
// failures, and the context's cause when the request's context ended.
func (c *Client) Do(r Request) (resp *http.Response, body []byte, truncated bool, err error) {
	req := r.HTTP
	if err := checkSecretDestinations(req.URL, r.SecretHeaders, r.Bindings); err != nil {
		return nil, nil, false, classifyTransportError(req.Context(), r.Tool, req.URL, err)
	}
	res, err := c.client(r).Do(req)
	if err != nil {
		return nil, nil, false, classifyTransportError(req.Context(), r.Tool, req.URL, err)
	}
	// res, not the named result: a failed read returns a nil resp, and the
	// deferred Close must still reach the body (closing a nil resp's body
	// was a panic, which the executor reported as UNKNOWN instead of the
	// timeout that cut the read).
	defer func() { _ = res.Body.Close() }()
	// The request's context bounds the read too: net/http ends a body read
	// when it ends, so a body that drips is cut at the deadline.
	body, truncated, err = readCapped(res.Body, c.cfg.MaxResponseBytes)
	if err != nil {
		return nil, nil, false, classifyTransportError(req.Context(), r.Tool, req.URL, err)
	}
	return res, body, truncated, nil
}

// Check is what Do checks before it sends r: a secret that may not go to
// r's destination in its header is refused (POLICY_DENIED), as Do refuses
// it. A preview asks it of the request it shows.
func (c *Client) Check(r Request) error {
	if err := checkSecretDestinations(r.HTTP.URL, r.SecretHeaders, r.Bindings); err != nil {
		return classifyTransportError(r.HTTP.Context(), r.Tool, r.HTTP.URL, err)
	}
	return nil
}

// requestContext bounds one request of tool, redirects and body included, by
// RequestTimeout. Its expiry is the cause the request fails with (Do returns
// the context's cause): TIMEOUT naming the limit, not a bare
// context.DeadlineExceeded, which the executor could only call UNKNOWN. When
// the tool's own timeout is shorter, it ends the context first, with its own
// cause.
func (c *Client) requestContext(ctx context.Context, tool string) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, c.cfg.RequestTimeout, envelope.NewToolError(envelope.CodeTimeout,
		"%s: no complete response within %s, the web tools' request timeout", tool, c.cfg.RequestTimeout))
}

// MaxResponseBytes is the most of a response body Do reads.
func (c *Client) MaxResponseBytes() int64 { return c.cfg.MaxResponseBytes }

// CheckURL parses a URL a tool may send a request to: what
// envelope.CheckHTTPURL checks (http or https, a host, a valid port, no user
// info), and a host that is a name or an IP address in a spelling a browser
// accepts.
func CheckURL(raw string) (*url.URL, error) {
	u, err := envelope.CheckHTTPURL(raw)
	if err != nil {
		return nil, err
	}
	if _, _, err := parseHost(u.Hostname()); err != nil {
		return nil, fmt.Errorf("url %q: %w", raw, err)
	}
	return u, nil
}

// classifyTransportError maps a failed request to the taxonomy. It returns
// nil when ctx ended: the executor then answers TIMEOUT (or leaves the call
// to another replica on shutdown).
func classifyTransportError(ctx context.Context, tool string, u *url.URL, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	var refused *DestinationRefusedError
	if errors.As(err, &refused) {
		return &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: tool + ": " + refused.Error()}
	}
	var unbound *SecretRefusedError
	if errors.As(err, &unbound) {
		return &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: tool + ": " + unbound.Error()}
	}
	var invalid *invalidHostError
	if errors.As(err, &invalid) {
		return envelope.NewToolError(envelope.CodeValidation, "%s: %v", tool, invalid)
	}
	var redirects *tooManyRedirectsError
	if errors.As(err, &redirects) {
		return envelope.NewToolError(envelope.CodeProviderError, "%s: %s: %v", tool, u.Redacted(), redirects)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return envelope.NewToolError(envelope.CodeNetworkError, "%s: cannot resolve %s: %s", tool, dnsErr.Name, dnsErr.Err)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return envelope.NewToolError(envelope.CodeNetworkError, "%s: %s %s: %v", tool, "request to", u.Redacted(), err)
}

// Statuses says which response statuses fail a call (StatusError).
type Statuses int

const (
	// FailuresOnly fails a call on the statuses that say the request
	// failed whatever it asked (429, 5xx, 401): the web tools, whose output
	// carries the status, show any other status to the model as data.
	FailuresOnly Statuses = iota
	// SuccessOnly fails a call on every status outside 2xx: an http tool,
	// whose output is the response's body and nothing else.
	SuccessOnly
)

// StatusError maps a response status that fails the call to the taxonomy,
// or returns nil. It is the one mapping of every HTTP tool:
//
//   - 429 RATE_LIMIT and 5xx PROVIDER_ERROR, both with the Retry-After the
//     server sent;
//   - 401 AUTH_REQUIRED (the credentials are missing or were refused);
//   - with SuccessOnly also: 403 AUTH_REQUIRED, 408 TIMEOUT, any other 4xx
//     VALIDATION_ERROR (the endpoint refused the request as sent, and the
//     body its details quote tells the model what to change), and 1xx or
//     3xx PROVIDER_ERROR (a redirect is not followed).
//
// The details hold the status and up to 1 KiB of a UTF-8 body, redacted
// (redact nil: as it is).
func StatusError(tool string, resp *http.Response, body []byte, redact func(string) string, now time.Time, fail Statuses) *envelope.ToolError {
	if redact == nil {
		redact = func(s string) string { return s }
	}
	var te *envelope.ToolError
	host := resp.Request.URL.Host
	code := resp.StatusCode
	switch {
	case code == http.StatusTooManyRequests:
		te = envelope.NewToolError(envelope.CodeRateLimit, "%s: %s answered %s", tool, host, resp.Status)
	case code >= 500:
		te = envelope.NewToolError(envelope.CodeProviderError, "%s: %s answered %s", tool, host, resp.Status)
	case code == http.StatusUnauthorized:
		te = envelope.NewToolError(envelope.CodeAuthRequired, "%s: %s answered %s: the credentials are missing or were refused", tool, host, resp.Status)
	case fail == FailuresOnly || code >= 200 && code < 300:
		return nil
	case code == http.StatusForbidden:
		te = envelope.NewToolError(envelope.CodeAuthRequired, "%s: %s answered %s: the credentials were refused for this request", tool, host, resp.Status)
	case code == http.StatusRequestTimeout:
		te = envelope.NewToolError(envelope.CodeTimeout, "%s: %s answered %s", tool, host, resp.Status)
	case code >= 400:
		te = envelope.NewToolError(envelope.CodeValidation, "%s: %s refused the request: %s", tool, host, resp.Status)
	case code >= 300:
		te = envelope.NewToolError(envelope.CodeProviderError, "%s: %s answered %s (to %q), and redirects are not followed: register the final URL",
			tool, host, resp.Status, redact(resp.Header.Get("Location")))
	default:
		te = envelope.NewToolError(envelope.CodeProviderError, "%s: %s answered %s", tool, host, resp.Status)
	}
	if s, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
		te.RetryAfterS = s
	}
	details := map[string]any{"status": resp.StatusCode}
	if p := Preview(body); p != "" {
		details["body"] = redact(p)
	}
	return te.WithDetails(details)
}

// Preview is what an error's details quote of a response body: up to 1 KiB
// of it, cut on a character boundary, or "" for an empty or binary body.
func Preview(body []byte) string {
	if len(body) > errorBodyPreview {
		body = body[:errorBodyPreview]
		// A cut may split a character: drop its first bytes.
		for i := 0; i < utf8.UTFMax && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1]
		}
	}
	if !utf8.Valid(body) {
		return ""
	}
	return string(body)
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return float64(n), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now).Seconds()
	return math.Max(0, math.Ceil(d)), true
}

// readCapped reads at most limit bytes of r and reports whether more followed.
func readCapped(r io.Reader, limit int64) ([]byte, bool, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(b)) > limit {
		return b[:limit], true, err
	}
	return b, false, err
}

// flattenHeaders joins each header's values with ", ".
func flattenHeaders(h http.Header, redact func(string) string) map[string]string {
	out := make(map[string]string, len(h))
	for k, vs := range h {
		out[k] = redact(strings.Join(vs, ", "))
	}
	return out
}
