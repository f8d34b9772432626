package docs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/sandbox"
)

// envUpdateDocs regenerates the docs' generated tables instead of checking
// them: TOOLWIRE_UPDATE_DOCS=1 go test ./docs -run TestDocTablesAreCurrent
// (make docs).
const envUpdateDocs = "TOOLWIRE_UPDATE_DOCS"

// documenter is a registry that also keeps the description of every metric
// registered through service.Metrics.
type documenter struct {
	*prometheus.Registry
	mu   sync.Mutex
	docs map[string]service.MetricDoc
}

func (d *documenter) Document(m service.MetricDoc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.docs[m.Name] = m
}

// metricsTable builds every service as its binary does and lists the metrics
// they register, one row each, sorted by name.
func metricsTable(t *testing.T) string {
	t.Helper()
	env := eventstest.Start(t)
	reg := &documenter{Registry: prometheus.NewRegistry(), docs: map[string]service.MetricDoc{}}
	d := service.Deps{JS: env.JS, Metrics: reg}
	var comps []service.Component
	add := func(c service.Component, err error) {
		t.Helper()
		require.NoError(t, err)
		comps = append(comps, c)
	}
	add(standard.Build(d))
	add(sandbox.Build(d))
	add(policy.Build(d))
	add(orchestrator.Build(d))
	add(recorder.Build(d, func(c *recorder.Config) { c.DatabaseURL = "sqlite:" + filepath.Join(t.TempDir(), "r.db") }))
	for _, c := range comps {
		require.NoError(t, c.Stop(context.Background()))
	}
	names := make([]string, 0, len(reg.docs))
	for n := range reg.docs {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("| metric | kind | labels | what it counts |\n|---|---|---|---|\n")
	for _, n := range names {
		m := reg.docs[n]
		labels := "—"
		if len(m.Labels) > 0 {
			labels = "`" + strings.Join(m.Labels, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Kind, labels, strings.ReplaceAll(m.Help, "|", "\\|"))
	}
	return b.String()
}

// envTable lists every documented variable: the ones every binary reads,
// then each service's.
func envTable() string {
	var b strings.Builder
	b.WriteString("| variable | read by | what it sets | example |\n|---|---|---|---|\n")
	row := func(who string, vars []service.Var) {
		for _, v := range vars {
			fmt.Fprintf(&b, "| `%s` | %s | %s | `%s` |\n", v.Name, who, strings.ReplaceAll(v.Help, "|", "\\|"), v.Example)
		}
	}
	row("every service", service.CommonEnvVars())
	row("orchestrator", orchestrator.EnvVars())
	row("policy", policy.EnvVars())
	row("executor", standard.EnvVars())
	row("sandbox", sandbox.EnvVars())
	row("recorder", recorder.EnvVars())
	return b.String()
}

// TestDocTablesAreCurrent: the environment, metrics and roles tables of
// docs/operations.md are generated from the code (the services' EnvVars,
// the metrics they register, the identity package's roles), so that they
// cannot drift from it.
func TestDocTablesAreCurrent(t *testing.T) {
	path := filepath.Join("..", "docs", "operations.md")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	for _, sec := range []struct{ name, body string }{
		{"env", envTable()},
		{"metrics", metricsTable(t)},
		{"roles", identity.Markdown()},
	} {
		begin, end := "<!-- generated:"+sec.name+" -->\n", "<!-- end:"+sec.name+" -->"
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		require.True(t, i >= 0 && j > i, "docs/operations.md has no %q ... %q section", strings.TrimSpace(begin), end)
		if os.Getenv(envUpdateDocs) == "1" {
			doc = doc[:i+len(begin)] + sec.body + doc[j:]
			continue
		}
		require.Equal(t, sec.body, doc[i+len(begin):j],
			"docs/operations.md's %s table is out of date: run `make docs` (%s=1 go test ./docs -run TestDocTablesAreCurrent)", sec.name, envUpdateDocs)
	}
	if os.Getenv(envUpdateDocs) == "1" {
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644)) //nolint:gosec // the repository's docs
	}
}
