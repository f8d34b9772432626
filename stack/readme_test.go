package stack_test

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
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/sandbox"
)

// envUpdateREADME regenerates the README's generated tables instead of
// checking them: TOOLWIRE_UPDATE_README=1 go test ./stack -run TestREADME
// (make docs).
const envUpdateREADME = "TOOLWIRE_UPDATE_README"

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
	add(executor.Build(d))
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
	row("executor", executor.EnvVars())
	row("sandbox", sandbox.EnvVars())
	row("recorder", recorder.EnvVars())
	return b.String()
}

// TestREADMETablesAreCurrent: the README's environment and metrics tables
// are generated from the code (the services' EnvVars and the metrics they
// register), so that they cannot drift from it.
func TestREADMETablesAreCurrent(t *testing.T) {
	path := filepath.Join("..", "README.md")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	readme := string(b)
	for _, sec := range []struct{ name, body string }{
		{"env", envTable()},
		{"metrics", metricsTable(t)},
		{"roles", identity.Markdown()},
	} {
		begin, end := "<!-- generated:"+sec.name+" -->\n", "<!-- end:"+sec.name+" -->"
		i, j := strings.Index(readme, begin), strings.Index(readme, end)
		require.True(t, i >= 0 && j > i, "README.md has no %q ... %q section", strings.TrimSpace(begin), end)
		if os.Getenv(envUpdateREADME) == "1" {
			readme = readme[:i+len(begin)] + sec.body + readme[j:]
			continue
		}
		require.Equal(t, sec.body, readme[i+len(begin):j],
			"README.md's %s table is out of date: run `make docs` (%s=1 go test ./stack -run TestREADME)", sec.name, envUpdateREADME)
	}
	if os.Getenv(envUpdateREADME) == "1" {
		require.NoError(t, os.WriteFile(path, []byte(readme), 0o644)) //nolint:gosec // the repository's README
	}
}
