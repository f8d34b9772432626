// Package httptool runs the registry entries of kind http: tools that are
// an HTTP endpoint (envelope.HTTPConfig). The executor sends each call's
// input, exactly as the call carried it, as the JSON body of a POST (or the
// config's PUT or PATCH) to the endpoint, and the response's JSON body is the
// call's output; the pipeline then checks it against the definition's output
// schema, as it checks every tool's.
//
// Requests go through the web tools' client (package web): its SSRF guard
// refuses loopback, private, link-local and metadata destinations unless
// TOOLWIRE_HTTP_ALLOW_HOSTS names them (POLICY_DENIED, nothing sent), and
// its cap on a response body (TOOLWIRE_HTTP_MAX_RESPONSE_BYTES) bounds what
// is read. A call is bounded by the tool's timeout alone.
//
// Each request carries:
//   - Content-Type: application/json, and Accept: application/json unless
//     the config's headers set it;
//   - the config's headers, and its secret headers with each
//     {{secret:NAME}} replaced by the secret resolved for the call's tenant
//     (the definition's required_secrets, which the executor resolves into
//     toolapi.Context.Auth), bound to the endpoint: the client checks that
//     they go to its scheme, host and port in those headers alone
//     (web.EndpointBindings);
//   - Idempotency-Key: <run_id>.<call_id> when the tool's side_effects is
//     writes (envelope.IdempotencyKey; the executor runs such a call at most
//     once, and the key lets the endpoint recognise a request it has already
//     seen, whatever happened between them). Not the call_id alone: two runs
//     that make the same first call share it.
//
// Outcomes: a 2xx response's body is the output (an empty body is null); a
// body that is not JSON, or longer than the cap, is PROVIDER_ERROR; any other
// status is mapped by web.StatusError with web.SuccessOnly (the one mapping
// of the HTTP tools: 400/404/409/422 and other 4xx VALIDATION_ERROR, 401/403
// AUTH_REQUIRED, 408 TIMEOUT, 429 RATE_LIMIT, 5xx PROVIDER_ERROR, a redirect
// PROVIDER_ERROR: redirects are not followed); DNS and connection failures
// are NETWORK_ERROR; the tool's timeout is TIMEOUT.
package httptool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// Runner runs the http registry entries on one guarded client.
type Runner struct {
	web *web.Client
	now func() time.Time
}

// NewRunner returns the runner of http entries whose requests go through c.
func NewRunner(c *web.Client) *Runner {
	return &Runner{web: c, now: time.Now}
}

// Tool returns the Tool that runs def, or the error that says why its
// config cannot run (an entry stored before its config was checked).
func (r *Runner) Tool(def *envelope.ToolDefinition) (toolapi.Tool, error) {
	cfg, err := def.HTTPConfig()
	if err != nil {
		return nil, err
	}
	u, err := web.CheckURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if len(cfg.SecretHeaders) > 0 {
		// Its secrets are bound to its endpoint, which must have an origin.
		if _, err := web.OriginOf(u); err != nil {
			return nil, fmt.Errorf("url %q: %w: its secrets cannot be bound to it", cfg.URL, err)
		}
	}
	return &endpoint{r: r, def: *def, cfg: cfg, url: u}, nil
}

// endpoint runs the calls of one http registry entry.
type endpoint struct {
	r   *Runner
	def envelope.ToolDefinition
	cfg envelope.HTTPConfig
	url *url.URL
}

func (e *endpoint) Definition() envelope.ToolDefinition { return e.def }

// request is the request a call with input sends, as Execute sends it and
// Preview shows it.
func (e *endpoint) request(ctx context.Context, input json.RawMessage, tc toolapi.Context) (web.Request, error) {
	name := e.def.Ref().String()
	hdr, secretNames, _, te := web.BuildHeaders(name, e.cfg.Headers, e.cfg.SecretHeaders, tc.Auth)
	if te != nil {
		return web.Request{}, te
	}
	// The endpoint is the binding of every secret the config sends.
	bindings, err := web.EndpointBindings(e.url, secretNames)
	if err != nil {
		return web.Request{}, envelope.NewToolError(envelope.CodePolicyDenied, "%s: %v: its secrets are sent nowhere", name, err)
	}
	req, err := http.NewRequestWithContext(ctx, e.cfg.MethodOrDefault(), e.url.String(), bytes.NewReader(input))
	if err != nil {
		return web.Request{}, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	req.Header = hdr
	req.Header.Set("Content-Type", "application/json")
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", web.UserAgent)
	}
	if e.def.Metadata.SideEffects == envelope.SideEffectsWrites {
		req.Header.Set(envelope.IdempotencyKeyHeader, envelope.IdempotencyKey(tc.RunID, tc.CallID))
	}
	return web.Request{Tool: name, HTTP: req, SecretHeaders: secretNames, Bindings: bindings, NoRedirects: true}, nil
}

// Preview is the request the call would send to the endpoint, checked as a
// call checks it and not sent (web.RequestPreview: secrets named, never
// their values). Every http entry can be previewed; its definition says
// supports_preview for the guard to ask.
func (e *endpoint) Preview(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	r, err := e.request(ctx, input, tc)
	if err != nil {
		return nil, err
	}
	if err := e.r.web.Check(r); err != nil {
		return nil, err
	}
	p := web.PreviewOf(r.HTTP, input, r.SecretHeaders, e.cfg.SecretHeaders)
	if e.cfg.PreviewURL != "" {
		answer, err := e.askPreviewEndpoint(r, input)
		if err != nil {
			return nil, err
		}
		p.EndpointPreview = answer
	}
	return json.Marshal(p)
}

// askPreviewEndpoint POSTs the call's input to the tool's dry-run endpoint
// (on the endpoint's origin, so its secrets may go there), with the
// request's headers, and returns its JSON answer.
func (e *endpoint) askPreviewEndpoint(r web.Request, input json.RawMessage) (json.RawMessage, error) {
	name := r.Tool
	pu, err := web.CheckURL(e.cfg.PreviewURL)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "%s: preview_url: %v", name, err)
	}
	req, err := http.NewRequestWithContext(r.HTTP.Context(), http.MethodPost, pu.String(), bytes.NewReader(input))
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "%s: %v", name, err)
	}
	req.Header = r.HTTP.Header.Clone()
	pr := r
	pr.HTTP = req
	resp, body, truncated, err := e.r.web.Do(pr)
	if err != nil {
		return nil, err
	}
	if te := web.StatusError(name+" preview", resp, body, nil, e.r.now(), web.SuccessOnly); te != nil {
		return nil, te
	}
	if truncated || !json.Valid(body) {
		return nil, envelope.NewToolError(envelope.CodeProviderError, "%s: its preview endpoint answered no JSON document (or one over %d bytes)", name, e.r.web.MaxResponseBytes())
	}
	return body, nil
}

func (e *endpoint) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	r, err := e.request(ctx, input, tc)
	if err != nil {
		return nil, err
	}
	// The pipeline scrubs every secret value from the output and the error
	// (message and details) before anyone sees them: no redaction here.
	name := r.Tool
	resp, body, truncated, err := e.r.web.Do(r)
	if err != nil {
		return nil, err
	}
	if te := web.StatusError(name, resp, body, nil, e.r.now(), web.SuccessOnly); te != nil {
		return nil, te
	}
	host := resp.Request.URL.Host
	if truncated {
		return nil, envelope.NewToolError(envelope.CodeProviderError,
			"%s: %s answered a body longer than %d bytes, the most the executor reads (TOOLWIRE_HTTP_MAX_RESPONSE_BYTES)",
			name, host, e.r.web.MaxResponseBytes()).WithDetails(map[string]any{"status": resp.StatusCode})
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return json.RawMessage("null"), nil
	}
	if !json.Valid(body) {
		ct := resp.Header.Get("Content-Type")
		details := map[string]any{"status": resp.StatusCode, "content_type": ct}
		if p := web.Preview(body); p != "" {
			details["body"] = p
		}
		what := "a body that is not JSON"
		if mt, _, _ := mime.ParseMediaType(ct); mt != "" {
			what += " (" + mt + ")"
		}
		return nil, envelope.NewToolError(envelope.CodeProviderError, "%s: %s answered %s", name, host, what).WithDetails(details)
	}
	return body, nil
}
