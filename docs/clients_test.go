package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// curlCommand matches a curl command of a shell block, its continuation
// lines (ending in a backslash) included.
var curlCommand = regexp.MustCompile(`(?m)^curl\b(?:[^\n]*\\\n)*[^\n]*`)

// curlURL matches the URL of a curl command: "$TW/v1/...".
var curlURL = regexp.MustCompile(`"\$TW(/v1/[^"?]*)`)

// TestClientsCurlRoutesExist: every curl command of docs/clients.md's curl
// quickstart calls a route and method that services/recorder/api/openapi.yaml
// documents, and the quickstart covers the four verbs (submit, follow, cancel,
// decide), so that renaming a route breaks a test, not the quickstart.
func TestClientsCurlRoutesExist(t *testing.T) {
	doc := readDoc(t, "docs/clients.md")
	start := strings.Index(doc, "\n## curl\n")
	require.GreaterOrEqual(t, start, 0, "docs/clients.md has a curl section")
	section := doc[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}

	b, err := os.ReadFile(filepath.Join(repoRoot, "services", "recorder", "api", "openapi.yaml"))
	require.NoError(t, err)
	var spec struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(b, &spec))
	require.NotEmpty(t, spec.Paths)

	// route finds the documented path a concrete one matches: its segments
	// equal, a template segment ({run_id}) matching a shell variable.
	route := func(p string) (string, bool) {
		segs := strings.Split(p, "/")
		for tmpl := range spec.Paths {
			ts := strings.Split(tmpl, "/")
			if len(ts) != len(segs) {
				continue
			}
			ok := true
			for i := range ts {
				isVar := strings.HasPrefix(segs[i], "$")
				isParam := strings.HasPrefix(ts[i], "{")
				if isVar != isParam || (!isVar && ts[i] != segs[i]) {
					ok = false
					break
				}
			}
			if ok {
				return tmpl, true
			}
		}
		return "", false
	}

	covered := map[string]bool{}
	for _, block := range fence.FindAllString(section, -1) {
		for _, cmd := range curlCommand.FindAllString(block, -1) {
			m := curlURL.FindStringSubmatch(cmd)
			if m == nil {
				t.Errorf("docs/clients.md: a curl command without a \"$TW/v1/...\" URL: %s", cmd)
				continue
			}
			method := "get"
			if strings.Contains(cmd, "-X POST") {
				method = "post"
			}
			tmpl, ok := route(m[1])
			if !ok {
				t.Errorf("docs/clients.md: %s %s: openapi.yaml has no such path", strings.ToUpper(method), m[1])
				continue
			}
			if _, ok := spec.Paths[tmpl][method]; !ok {
				t.Errorf("docs/clients.md: %s %s: openapi.yaml's %s has no %s", strings.ToUpper(method), m[1], tmpl, method)
				continue
			}
			covered[strings.ToUpper(method)+" "+tmpl] = true
		}
	}
	for _, want := range []string{
		"POST /v1/runs",
		"GET /v1/runs/{run_id}/events/stream",
		"POST /v1/runs/{run_id}/cancel",
		"POST /v1/runs/{run_id}/calls/{call_id}/decision",
		"GET /v1/runs/{run_id}/outputs",
	} {
		require.True(t, covered[want], "docs/clients.md's curl quickstart has no %s (it has %v)", want, covered)
	}
}
