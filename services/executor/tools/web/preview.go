package web

import (
	"encoding/json"
	"maps"
	"net/http"
	"regexp"
	"slices"
)

// RequestPreview is the dry run of an HTTP tool's call: the request it
// would send, not sent. A secret header shows its template with each
// secret named, never its value ("Bearer [secret GITHUB_TOKEN]").
type RequestPreview struct {
	DryRun  bool              `json:"dry_run"`
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	// Body is the body as it would be sent, byte for byte.
	Body string `json:"body,omitempty"`
	// Secrets are the secrets the request would carry, by name.
	Secrets []string `json:"secrets,omitempty"`
	// EndpointPreview is what the tool's own dry-run endpoint answered,
	// for an http tool that has one (preview_url).
	EndpointPreview json.RawMessage `json:"endpoint_preview,omitempty"`
}

var secretRefRE = regexp.MustCompile(`\{\{\s*secret:([A-Za-z0-9_.\-]+)\s*\}\}`)

// MaskSecrets is a secret header's template with each {{secret:NAME}} shown
// as [secret NAME].
func MaskSecrets(tmpl string) string { return secretRefRE.ReplaceAllString(tmpl, "[secret $1]") }

// PreviewOf is the preview of req, whose secret headers (their names as
// BuildHeaders returned them) came from the templates secret.
func PreviewOf(req *http.Request, body []byte, secretHeaders []SecretHeader, secret map[string]string) RequestPreview {
	p := RequestPreview{DryRun: true, Method: req.Method, URL: req.URL.String(), Headers: map[string]string{}}
	for k, vs := range req.Header {
		if len(vs) > 0 {
			p.Headers[k] = vs[0]
		}
	}
	templates := map[string]string{}
	for k, v := range secret {
		templates[http.CanonicalHeaderKey(k)] = v
	}
	seen := map[string]bool{}
	for _, sh := range secretHeaders {
		k := http.CanonicalHeaderKey(sh.Name)
		p.Headers[k] = MaskSecrets(templates[k])
		for _, s := range sh.Secrets {
			seen[s] = true
		}
	}
	p.Secrets = slices.Sorted(maps.Keys(seen))
	p.Body = string(body)
	return p
}
