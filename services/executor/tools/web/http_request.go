package web

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// http_request and http_get call HTTP APIs through the SSRF-guarded client.
//
// A tool has one side_effects value, and the Policy Guard decides on it before
// the call runs, so the two are separate tools: http_request (any method,
// side_effects writes: it can POST, so it runs at most once per call_id and is
// never cached) and http_get (GET only, side_effects reads). Give an agent
// http_get when it only needs to read.
//
// Secrets are injected by name: secret_headers {"Authorization": "Bearer
// {{secret:GITHUB_TOKEN}}"} takes the value of GITHUB_TOKEN from the call's
// toolapi.Context.Auth. The executor fills Auth with the secrets the registry
// entry lists in required_secrets, so an operator registers a version of
// http_request (or http_get) that names the secrets it may use and where
// each may go, for example http_get@1.0.0-github with required_secrets
// ["GITHUB_TOKEN"] and secret_destinations {"GITHUB_TOKEN": {"hosts":
// ["api.github.com"], "headers": ["Authorization"]}}. A secret that is not in
// Auth is AUTH_REQUIRED; one sent to a destination or in a header its
// binding does not name, or that has no binding, is POLICY_DENIED before
// anything is sent (secretdest.go). Secret headers are dropped when a
// redirect leaves the first URL's scheme, host and port, and any secret
// value that comes back in the response is replaced by [REDACTED].

// redacted replaces a secret's value wherever it would be shown.
const redacted = "[REDACTED]"

const httpHeadersSchema = `{"type": "object", "maxProperties": 64,
      "additionalProperties": {"type": "string", "maxLength": 8192},
      "description": "Request headers."}`

//nolint:gosec // G101: a JSON Schema describing {{secret:NAME}} placeholders, not a credential
const httpSecretHeadersSchema = `{"type": "object", "maxProperties": 16,
      "additionalProperties": {"type": "string", "maxLength": 8192, "pattern": "\\{\\{\\s*secret:[A-Za-z_][A-Za-z0-9_]*\\s*\\}\\}"},
      "description": "Headers carrying secrets: each {{secret:NAME}} is replaced by the secret NAME, e.g. {\"Authorization\": \"Bearer {{secret:API_TOKEN}}\"}."}`

const httpOutputSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "status": {"type": "integer", "minimum": 100, "maximum": 999},
    "url": {"type": "string", "description": "The URL of the final response, after redirects."},
    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
    "body": {"description": "The JSON value when the response is complete JSON; otherwise the text, or base64 for binary bodies."},
    "body_encoding": {"enum": ["json", "text", "base64"]},
    "bytes": {"type": "integer", "minimum": 0, "description": "Bytes of the body read."},
    "truncated": {"type": "boolean", "description": "The body was longer than the cap and was cut."}
  },
  "required": ["status", "url", "headers", "body", "body_encoding", "bytes", "truncated"],
  "additionalProperties": false
}`

// httpTool is http_request (any method) or http_get (GET only).
type httpTool struct {
	web     *Client
	getOnly bool
	now     func() time.Time
}

func (t httpTool) name() string {
	if t.getOnly {
		return "http_get"
	}
	return "http_request"
}

func (t httpTool) Definition() envelope.ToolDefinition {
	if t.getOnly {
		d := toolapi.BuiltinDefinition("http_get",
			"Fetches a URL with HTTP GET and returns the status, headers and body (JSON bodies parsed). "+
				"Private, loopback and metadata addresses are refused.",
			envelope.CategoryAPI,
			`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "An http or https URL."},
    "headers": `+httpHeadersSchema+`,
    "secret_headers": `+httpSecretHeadersSchema+`
  },
  "required": ["url"],
  "additionalProperties": false
}`, httpOutputSchema)
		d.Metadata.SideEffects = envelope.SideEffectsReads
		d.SupportsPreview = true // the request it would send
		return d
	}
	d := toolapi.BuiltinDefinition("http_request",
		"Sends an HTTP request (any method) and returns the status, headers and body (JSON bodies parsed). "+
			"Can change remote state. Private, loopback and metadata addresses are refused.",
		envelope.CategoryAPI,
		`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "method": {"type": "string", "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"], "default": "GET"},
    "url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "An http or https URL."},
    "headers": `+httpHeadersSchema+`,
    "secret_headers": `+httpSecretHeadersSchema+`,
    "body": {"description": "The request body: a string is sent as it is; any other JSON value is sent as JSON (content-type application/json unless headers set one)."}
  },
  "required": ["url"],
  "additionalProperties": false
}`, httpOutputSchema)
	d.Metadata.SideEffects = envelope.SideEffectsWrites
	d.SupportsPreview = true // the request it would send
	// An HTTP method says what a call does: a read is low risk, a write
	// medium, a deletion high.
	d.Risk = &envelope.RiskPolicy{Default: envelope.RiskMedium, Field: "method", Actions: map[string]envelope.Risk{
		http.MethodGet: envelope.RiskLow, http.MethodHead: envelope.RiskLow, http.MethodOptions: envelope.RiskLow,
		http.MethodPost: envelope.RiskMedium, http.MethodPut: envelope.RiskMedium, http.MethodPatch: envelope.RiskMedium,
		http.MethodDelete: envelope.RiskHigh,
	}}
	return d
}

type httpIn struct {
	Method        string            `json:"method"`
	URL           string            `json:"url"`
	Headers       map[string]string `json:"headers"`
	SecretHeaders map[string]string `json:"secret_headers"`
	Body          json.RawMessage   `json:"body"`
}

type httpOut struct {
	Status       int               `json:"status"`
	URL          string            `json:"url"`
	Headers      map[string]string `json:"headers"`
	Body         any               `json:"body"`
	BodyEncoding string            `json:"body_encoding"`
	Bytes        int               `json:"bytes"`
	Truncated    bool              `json:"truncated"`
}

// built is a call's request as Execute sends it and Preview shows it.
type built struct {
	in      httpIn
	req     *http.Request
	body    []byte
	secret  []SecretHeader
	secrets []string // the values, for redaction
}

// build makes the request a call with input sends, under ctx.
func (t httpTool) build(ctx context.Context, input json.RawMessage, tc toolapi.Context) (built, error) {
	name := t.name()
	var b built
	if err := toolapi.DecodeInput(name, input, &b.in); err != nil {
		return b, err
	}
	in := &b.in
	if t.getOnly || in.Method == "" {
		in.Method = http.MethodGet
	}
	u, err := CheckURL(in.URL)
	if err != nil {
		return b, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	hdr, secretNames, secrets, te := BuildHeaders(name, in.Headers, in.SecretHeaders, tc.Auth)
	if te != nil {
		return b, te
	}
	b.secret, b.secrets = secretNames, secrets
	if len(in.Body) > 0 && !bytes.Equal(in.Body, []byte("null")) {
		if in.Method == http.MethodGet || in.Method == http.MethodHead {
			return b, envelope.NewToolError(envelope.CodeValidation, "%s: a %s request has no body", name, in.Method)
		}
		var s string
		if json.Unmarshal(in.Body, &s) == nil {
			b.body = []byte(s)
		} else {
			b.body = in.Body
			if hdr.Get("Content-Type") == "" {
				hdr.Set("Content-Type", "application/json")
			}
		}
	}
	var body io.Reader
	if b.body != nil {
		body = bytes.NewReader(b.body)
	}
	b.req, err = http.NewRequestWithContext(ctx, in.Method, u.String(), body)
	if err != nil {
		return b, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	b.req.Header = hdr
	if b.req.Header.Get("User-Agent") == "" {
		b.req.Header.Set("User-Agent", UserAgent)
	}
	return b, nil
}

// Preview is the request the call would send, checked as a call checks it
// (the URL, the headers, where its secrets may go) and not sent: a
// RequestPreview, each secret header shown with its secrets named, never
// their values.
func (t httpTool) Preview(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	b, err := t.build(ctx, input, tc)
	if err != nil {
		return nil, err
	}
	if err := t.web.Check(Request{Tool: t.name(), HTTP: b.req, SecretHeaders: b.secret, Bindings: tc.SecretDestinations}); err != nil {
		return nil, err
	}
	return json.Marshal(PreviewOf(b.req, b.body, b.secret, b.in.SecretHeaders))
}

func (t httpTool) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	name := t.name()
	ctx, cancel := t.web.requestContext(ctx, name)
	defer cancel()
	b, err := t.build(ctx, input, tc)
	if err != nil {
		return nil, err
	}
	redact := redactor(b.secrets)
	resp, raw, truncated, err := t.web.Do(Request{Tool: name, HTTP: b.req, SecretHeaders: b.secret, Bindings: tc.SecretDestinations})
	if err != nil {
		return nil, err
	}
	if te := StatusError(name, resp, raw, redact, t.now(), FailuresOnly); te != nil {
		return nil, te
	}
	out := httpOut{
		Status:    resp.StatusCode,
		URL:       redact(resp.Request.URL.String()),
		Headers:   flattenHeaders(resp.Header, redact),
		Bytes:     len(raw),
		Truncated: truncated,
	}
	out.Body, out.BodyEncoding = decodeBody(raw, truncated, resp.Header.Get("Content-Type"), redact)
	return json.Marshal(out)
}

// BuildHeaders checks a tool's headers (envelope.CheckHeader) and resolves
// the secret ones from auth. It returns the header, the secret headers with
// the secrets each holds (for Request.SecretHeaders, which checks them
// against their bindings and drops them on a redirect elsewhere), and the
// secret values used (for redaction). A bad header is VALIDATION_ERROR; a
// secret missing from auth, or whose value cannot be a header,
// AUTH_REQUIRED.
func BuildHeaders(tool string, plain, secret map[string]string, auth map[string]string) (http.Header, []SecretHeader, []string, *envelope.ToolError) {
	if len(plain)+len(secret) > envelope.MaxHTTPHeaders {
		return nil, nil, nil, envelope.NewToolError(envelope.CodeValidation, "%s: at most %d headers", tool, envelope.MaxHTTPHeaders)
	}
	h := http.Header{}
	// Sorted, so that a problem is reported the same way every time.
	for _, k := range slices.Sorted(maps.Keys(plain)) {
		v := plain[k]
		if err := envelope.CheckHeader(k, v); err != nil {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeValidation, "%s: %v", tool, err)
		}
		if len(envelope.SecretRefs(v)) > 0 {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeValidation, "%s: header %s names a secret: put it in secret_headers", tool, http.CanonicalHeaderKey(k))
		}
		h.Add(k, v)
	}
	var names []SecretHeader
	var values []string
	for _, k := range slices.Sorted(maps.Keys(secret)) {
		tmpl := secret[k]
		if err := envelope.CheckHeader(k, tmpl); err != nil {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeValidation, "%s: %v", tool, err)
		}
		if len(envelope.SecretRefs(tmpl)) == 0 {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeValidation, "%s: secret header %s names no {{secret:NAME}}; put plain values in headers", tool, http.CanonicalHeaderKey(k))
		}
		v, missing := envelope.ExpandSecretRefs(tmpl, func(name string) (string, bool) {
			s, ok := auth[name]
			if ok && s != "" {
				values = append(values, s)
			}
			return s, ok && s != ""
		})
		if missing != "" {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeAuthRequired, "%s: secret %q is not available to this tool: list it in the tool's required_secrets and store it (toolwire secrets set)", tool, missing)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, nil, nil, envelope.NewToolError(envelope.CodeAuthRequired, "%s: the secret in header %s holds a line break or NUL", tool, http.CanonicalHeaderKey(k))
		}
		h.Set(k, v)
		names = append(names, SecretHeader{Name: k, Secrets: envelope.SecretRefs(tmpl)})
	}
	return h, names, values, nil
}

// redactor returns a function that replaces every secret value in a string.
func redactor(secrets []string) func(string) string {
	var pairs []string
	for _, s := range secrets {
		if s != "" {
			pairs = append(pairs, s, redacted)
		}
	}
	if len(pairs) == 0 {
		return func(s string) string { return s }
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}

// decodeBody returns a body as the output shows it: the JSON value of a
// complete JSON body, the text of a UTF-8 body, base64 otherwise.
func decodeBody(raw []byte, truncated bool, contentType string, redact func(string) string) (any, string) {
	if !truncated && isJSONType(contentType) {
		text := redact(string(raw))
		if json.Valid([]byte(text)) && len(bytes.TrimSpace(raw)) > 0 {
			return json.RawMessage(text), "json"
		}
	}
	if utf8.Valid(raw) {
		return redact(string(raw)), "text"
	}
	if truncated {
		// A cut may split a UTF-8 sequence: drop the partial rune.
		for i := 1; i <= utf8.UTFMax && i <= len(raw); i++ {
			if utf8.Valid(raw[:len(raw)-i]) {
				return redact(string(raw[:len(raw)-i])), "text"
			}
		}
	}
	return base64.StdEncoding.EncodeToString([]byte(redact(string(raw)))), "base64"
}

func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
