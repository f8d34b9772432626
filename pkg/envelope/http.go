package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// HTTPConfig is the implementation config of a tool of kind http: the
// executor sends each call's input, as the call carried it, as a JSON body to
// URL, and the response's JSON body is the call's output.
//
//	"implementation": {"kind": "http", "config": {
//	  "url": "https://api.example.com/v1/weather",
//	  "headers": {"X-Api-Version": "2"},
//	  "secret_headers": {"Authorization": "Bearer {{secret:WEATHER_KEY}}"}}}
//
// The tool's secrets reach the endpoint as headers only: every secret of
// required_secrets is named in a secret header, and a secret header names
// only secrets of required_secrets.
type HTTPConfig struct {
	// URL is the endpoint: http or https, with a host and no user info.
	URL string `json:"url"`
	// Method is POST (the default), PUT or PATCH: a method with a body.
	Method string `json:"method,omitempty"`
	// Headers are sent with every call as they are written.
	Headers map[string]string `json:"headers,omitempty"`
	// SecretHeaders are sent with every call, each {{secret:NAME}} replaced
	// by the value of the secret NAME resolved for the call's tenant.
	SecretHeaders map[string]string `json:"secret_headers,omitempty"`
	// PreviewURL is an optional dry-run endpoint on URL's origin: a
	// preview POSTs the call's input there, with the same headers, and
	// shows its JSON answer.
	PreviewURL string `json:"preview_url,omitempty"`
}

// DefaultHTTPMethod is the method of an http tool whose config names none.
const DefaultHTTPMethod = "POST"

// Bounds of an http tool's headers, and of a header a web tool is given.
const (
	MaxHTTPHeaders       = 64
	maxHeaderNameBytes   = 256
	maxHeaderValueBytes  = 8192
	maxHTTPURLBytes      = 8192
	httpConfigProblemFmt = "implementation.config: %s"
)

// IdempotencyKeyHeader carries IdempotencyKey on each call to an http tool
// whose side_effects is writes: the endpoint can recognise a request it has
// seen.
const IdempotencyKeyHeader = "Idempotency-Key"

// IdempotencyKey identifies one call of one run: "<run_id>.<call_id>", the
// same on every run of the call (a tool declaring metadata.idempotent is run
// again with it after its executor died during the call). The
// call_id alone does not: it hashes the tool, the input and the call's place
// in its run, so two runs that make the same first call share it, and an
// endpoint keyed on it would take the second run's write for a replay of the
// first's. run_id and call_id are subject tokens, so the key is a plain
// header value.
func IdempotencyKey(runID, callID string) string { return runID + "." + callID }

// httpMethods are the methods an http tool may use: those with a body.
var httpMethods = []string{"POST", "PUT", "PATCH"}

// MethodOrDefault is the config's method, DefaultHTTPMethod when unset.
func (c HTTPConfig) MethodOrDefault() string {
	if c.Method == "" {
		return DefaultHTTPMethod
	}
	return c.Method
}

// HTTPConfig reads and checks the implementation config of a tool of kind
// http against the definition's required secrets.
func (d *ToolDefinition) HTTPConfig() (HTTPConfig, error) {
	var c HTTPConfig
	if d.Implementation.Kind != ImplHTTP {
		return c, fmt.Errorf("implementation kind %q is not http", d.Implementation.Kind)
	}
	raw := bytes.TrimSpace(d.Implementation.Config)
	if len(raw) == 0 || string(raw) == "null" {
		return c, errors.New(`implementation.config: an http tool needs {"url": ...}`)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf(httpConfigProblemFmt, err)
	}
	if problems := c.problems(d.RequiredSecrets); len(problems) > 0 {
		return c, errors.New(strings.Join(problems, "; "))
	}
	return c, nil
}

// problems lists what is wrong with the config, each prefixed with its
// place in the definition.
func (c HTTPConfig) problems(requiredSecrets []string) []string {
	var out []string
	add := func(format string, args ...any) {
		out = append(out, fmt.Sprintf(httpConfigProblemFmt, fmt.Sprintf(format, args...)))
	}
	if u, err := CheckHTTPURL(c.URL); err != nil {
		add("%v", err)
	} else if err := checkEndpointHost(u.Hostname()); err != nil {
		add("url %q: %v", c.URL, err)
	}
	if c.PreviewURL != "" {
		pu, perr := CheckHTTPURL(c.PreviewURL)
		u, uerr := CheckHTTPURL(c.URL)
		switch {
		case perr != nil:
			add("preview_url: %v", perr)
		case uerr == nil && !sameHTTPOrigin(u, pu):
			add("preview_url %q is not on the origin of url %q (scheme, host and port): the tool's secrets go to one origin only", c.PreviewURL, c.URL)
		}
	}
	if c.Method != "" && !slices.Contains(httpMethods, c.Method) {
		add("method %q is not one of %s", truncateForError(c.Method), strings.Join(httpMethods, ", "))
	}
	if n := len(c.Headers) + len(c.SecretHeaders); n > MaxHTTPHeaders {
		add("%d headers; at most %d", n, MaxHTTPHeaders)
	}
	seen := map[string]bool{}
	checkName := func(field, k, v string) bool {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if err := CheckHeader(k, v); err != nil {
			add("%s: %v", field, err)
			return false
		}
		switch {
		case ck == "Content-Type" || ck == IdempotencyKeyHeader:
			add("%s: header %s is set by the executor (the body is the input as JSON; the idempotency key is <run_id>.<call_id>)", field, ck)
			return false
		case seen[ck]:
			add("%s: header %s is given twice", field, ck)
			return false
		}
		seen[ck] = true
		return true
	}
	for _, k := range slices.Sorted(maps.Keys(c.Headers)) {
		v := c.Headers[k]
		if checkName("headers", k, v) && len(SecretRefs(v)) > 0 {
			add("headers: header %s names a secret: put it in secret_headers", textproto.CanonicalMIMEHeaderKey(k))
		}
	}
	used := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(c.SecretHeaders)) {
		v := c.SecretHeaders[k]
		if !checkName("secret_headers", k, v) {
			continue
		}
		refs := SecretRefs(v)
		if len(refs) == 0 {
			add("secret_headers: header %s names no {{secret:NAME}}; put plain values in headers", textproto.CanonicalMIMEHeaderKey(k))
		}
		for _, name := range refs {
			used[name] = true
			if !slices.Contains(requiredSecrets, name) {
				add("secret_headers: header %s names the secret %s, which required_secrets does not list", textproto.CanonicalMIMEHeaderKey(k), name)
			}
		}
	}
	for _, name := range requiredSecrets {
		if !used[name] {
			add("required_secrets lists %s, which no secret header sends: an http tool's secrets reach its endpoint only as headers", name)
		}
	}
	return out
}

// CheckHTTPURL parses the URL of an HTTP endpoint: http or https, a host, a
// port from 1 to 65535 if any, and no user info (credentials belong in
// secret headers, where they are never shown).
func CheckHTTPURL(raw string) (*url.URL, error) {
	if len(raw) > maxHTTPURLBytes {
		return nil, fmt.Errorf("url of %d bytes: at most %d", len(raw), maxHTTPURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("url %q: %w", raw, errors.Unwrap(err))
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
	default:
		return nil, fmt.Errorf("url %q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("url %q: no host", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("url %q: credentials in the URL are not accepted: use secret_headers", u.Redacted())
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("url %q: port %q is not a number from 1 to 65535", raw, p)
		}
	}
	return u, nil
}

// checkEndpointHost refuses an endpoint's host that is an IP address in
// anything but its usual form: an operator writes 10.0.0.7 or [fd00::7], and
// a host like 1.2.3.4.5 or 0x7f.1, which browsers read in their own ways (and
// the executor's guard reads as they do), is a mistake to report at once.
func checkEndpointHost(host string) error {
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	last := strings.ToLower(labels[len(labels)-1])
	numeric := last != "" && strings.Trim(last, "0123456789") == "" ||
		strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == ""
	if !numeric && !strings.Contains(host, ":") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Zone() == "" && !ip.Is4In6() {
		return nil
	}
	return fmt.Errorf("host %q is not a domain name, and not an IP address in its usual form (10.0.0.7, [fd00::7])", truncateForError(host))
}

// hopHeaders are set by the HTTP client itself; nobody else may give them.
var hopHeaders = []string{
	"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te",
	"Trailer", "Keep-Alive", "Proxy-Connection",
}

// headerNameRE is an RFC 9110 field name (a token).
var headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// CheckHeader checks a request header given to an HTTP tool: a valid field
// name that the client does not set itself, and a value without control
// characters (a line break would forge another header).
func CheckHeader(name, value string) error {
	ck := textproto.CanonicalMIMEHeaderKey(name)
	switch {
	case len(name) > maxHeaderNameBytes || !headerNameRE.MatchString(name):
		return fmt.Errorf("header name %q is not a valid field name", truncateForError(name))
	case slices.Contains(hopHeaders, ck) || strings.HasPrefix(ck, "Proxy-"):
		return fmt.Errorf("header %s is set by the client and cannot be given", ck)
	case strings.ContainsAny(value, "\r\n\x00"):
		return fmt.Errorf("header %s holds a line break or NUL", ck)
	case strings.ContainsFunc(value, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }):
		return fmt.Errorf("header %s holds a control character", ck)
	case len(value) > maxHeaderValueBytes:
		return fmt.Errorf("header %s is %d bytes; at most %d", ck, len(value), maxHeaderValueBytes)
	}
	return nil
}

// secretRefRE is a {{secret:NAME}} placeholder; NAME as ValidateSecretName
// checks it.
var secretRefRE = regexp.MustCompile(`\{\{\s*secret:([A-Za-z_][A-Za-z0-9_]{0,63})\s*\}\}`)

// SecretRefs returns the names of the secrets s refers to as {{secret:NAME}},
// in order.
func SecretRefs(s string) []string {
	var names []string
	for _, m := range secretRefRE.FindAllStringSubmatch(s, -1) {
		names = append(names, m[1])
	}
	return names
}

// ExpandSecretRefs replaces each {{secret:NAME}} of s by lookup(NAME). When
// lookup has no value for a name, missing is the first such name and the
// result is not to be used.
func ExpandSecretRefs(s string, lookup func(name string) (string, bool)) (expanded, missing string) {
	expanded = secretRefRE.ReplaceAllStringFunc(s, func(m string) string {
		name := secretRefRE.FindStringSubmatch(m)[1]
		v, ok := lookup(name)
		if !ok && missing == "" {
			missing = name
		}
		return v
	})
	return expanded, missing
}

// sameHTTPOrigin reports whether a and b have the same scheme, host and
// port (the scheme's default when none is written).
func sameHTTPOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		if strings.EqualFold(u.Scheme, "https") {
			return "443"
		}
		return "80"
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}
