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
	webUserAgent     = "toolwire/1.0 (+https://toolwire.dev)"
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
	// 30s); the tool's own timeout still applies when shorter.
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
		Proxy:                  nil,
		DialContext:            d.DialContext,
		ForceAttemptHTTP2:      true,
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  cfg.RequestTimeout,
		ExpectContinueTimeout:  time.Second,
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

// client returns an http.Client for one request. Headers named in
// secretHeaders are dropped when a redirect leaves the first request's
// scheme, host and port, so a secret never follows a redirect elsewhere.
func (c *Client) client(secretHeaders []string) *http.Client {
	return &http.Client{
		Transport: c.transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > c.cfg.MaxRedirects {
				return &tooManyRedirectsError{max: c.cfg.MaxRedirects}
			}
			first := via[0].URL
			if req.URL.Scheme != first.Scheme || !strings.EqualFold(req.URL.Host, first.Host) {
				for _, h := range secretHeaders {
					req.Header.Del(h)
				}
			}
			return nil
		},
	}
}

// do sends req with the client of secretHeaders, reads its body (at most
// MaxResponseBytes; truncated says more followed) and closes it. A failure
// is tool's error, as classifyTransportError maps it.
func (c *Client) do(tool string, req *http.Request, secretHeaders []string) (resp *http.Response, body []byte, truncated bool, err error) {
	resp, err = c.client(secretHeaders).Do(req)
	if err != nil {
		return nil, nil, false, classifyTransportError(req.Context(), tool, req.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, truncated, err = readCapped(resp.Body, c.cfg.MaxResponseBytes)
	if err != nil {
		return nil, nil, false, classifyTransportError(req.Context(), tool, req.URL, err)
	}
	return resp, body, truncated, nil
}

// checkURL parses a URL the web tools may fetch: http or https, a valid
// host, no user info (credentials belong in secret_headers).
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url %q: %w", raw, err)
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
	default:
		return nil, fmt.Errorf("url %q: scheme must be http or https", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("url %q: no host", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("url %q: credentials in the URL are not accepted: use secret_headers", raw)
	}
	if _, _, err := parseHost(u.Hostname()); err != nil {
		return nil, fmt.Errorf("url %q: %w", raw, err)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("url %q: port %q is not a number from 1 to 65535", raw, p)
		}
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

// statusError maps a response status that is a failure of the call, or
// returns nil: 429 is RATE_LIMIT, 5xx PROVIDER_ERROR (both with the
// Retry-After the server sent), 401 AUTH_REQUIRED (the credentials are
// missing or were refused). Other statuses are the output's data.
func statusError(tool string, resp *http.Response, body []byte, redact func(string) string, now time.Time) *envelope.ToolError {
	var te *envelope.ToolError
	host := resp.Request.URL.Host
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		te = envelope.NewToolError(envelope.CodeRateLimit, "%s: %s answered %s", tool, host, resp.Status)
	case resp.StatusCode >= 500:
		te = envelope.NewToolError(envelope.CodeProviderError, "%s: %s answered %s", tool, host, resp.Status)
	case resp.StatusCode == http.StatusUnauthorized:
		te = envelope.NewToolError(envelope.CodeAuthRequired, "%s: %s answered %s: the credentials are missing or were refused", tool, host, resp.Status)
	default:
		return nil
	}
	if s, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
		te.RetryAfterS = s
	}
	preview := body
	if len(preview) > errorBodyPreview {
		preview = preview[:errorBodyPreview]
	}
	details := map[string]any{"status": resp.StatusCode}
	if len(preview) > 0 && utf8.Valid(preview) {
		details["body"] = redact(string(preview))
	}
	return te.WithDetails(details)
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
