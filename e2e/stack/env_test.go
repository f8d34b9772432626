package stack_test

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/sandbox"
	"github.com/toolwire/toolwire/stack"
)

// serviceConfig ties a service's documented variables to its ConfigFromEnv
// and to the configuration a running stack's service has.
type serviceConfig struct {
	name    string
	vars    []service.Var
	fromEnv func(getenv func(string) string) (any, error)
	running func(st *stack.Stack) any
}

func serviceConfigs() []serviceConfig {
	return []serviceConfig{
		{"executor", executor.EnvVars(),
			func(g func(string) string) (any, error) { return executor.ConfigFromEnv(g) },
			func(st *stack.Stack) any { return st.Executors[0].Config() }},
		// The executor's standard families: the web tools, the MCP servers.
		{"executor's standard families", standard.FamilyEnvVars(),
			func(g func(string) string) (any, error) { return standard.ConfigFromEnv(g) },
			func(st *stack.Stack) any { c, _ := standard.ConfigOf(st.Executors[0]); return c }},
		{"sandbox", sandbox.EnvVars(),
			func(g func(string) string) (any, error) { return sandbox.ConfigFromEnv(g) },
			func(st *stack.Stack) any { return st.Sandbox.Config() }},
		{"policy", policy.EnvVars(),
			func(g func(string) string) (any, error) { return policy.ConfigFromEnv(g) },
			func(st *stack.Stack) any { return st.Policy.Config() }},
		{"orchestrator", orchestrator.EnvVars(),
			func(g func(string) string) (any, error) { return orchestrator.ConfigFromEnv(g) },
			func(st *stack.Stack) any { return st.Orchestrator.Config() }},
		{"recorder", recorder.EnvVars(),
			func(g func(string) string) (any, error) { return recorder.ConfigFromEnv(g) },
			func(st *stack.Stack) any { return st.Recorder.(*recorder.Service).Config() }},
	}
}

// changedFields names the exported fields of two configurations (structs of
// one type) that differ.
func changedFields(a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := range va.NumField() {
		if !va.Type().Field(i).IsExported() {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			out = append(out, va.Type().Field(i).Name)
		}
	}
	return out
}

func field(v any, name string) any { return reflect.ValueOf(v).FieldByName(name).Interface() }

// TestEveryDocumentedVariableTakesEffectUnderDev starts the pipeline as
// `toolwire dev` does, in one process, with every documented variable of
// every service set, and shows that each one reaches the service that reads
// it: for each variable, the fields of its service's configuration that the
// variable alone changes hold, in the running service, the value the whole
// environment gives them.
func TestEveryDocumentedVariableTakesEffectUnderDev(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{}
	for _, sc := range serviceConfigs() {
		for _, v := range sc.vars {
			env[v.Name] = v.Example
		}
	}
	// Examples that name things this machine has elsewhere are given values
	// that run here; each still differs from its variable's default or sets a
	// field the test follows.
	for k, v := range map[string]string{
		sandbox.EnvPython:   "/usr/bin/python3",
		sandbox.EnvBwrap:    "/usr/bin/bwrap",
		sandbox.EnvRunsc:    "/usr/bin/runsc",
		sandbox.EnvStateDir: filepath.Join(dir, "sandbox"),
		// toolwire dev passes DATABASE_URL to the recorder (its
		// --database-url default); a SQLite file keeps the test hermetic.
		recorder.EnvDatabaseURL: "sqlite:" + filepath.Join(dir, "recorder.db"),
	} {
		env[k] = v
	}
	getenv := func(k string) string { return env[k] }

	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Getenv: getenv, Recorder: recorder.ForStack(getenv(recorder.EnvDatabaseURL))})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	empty := func(string) string { return "" }
	checked := 0
	for _, sc := range serviceConfigs() {
		base, err := sc.fromEnv(empty)
		require.NoError(t, err, sc.name)
		all, err := sc.fromEnv(getenv)
		require.NoError(t, err, sc.name)
		running := sc.running(st)
		for _, v := range sc.vars {
			only, err := sc.fromEnv(func(k string) string {
				if k == v.Name {
					return v.Example
				}
				return ""
			})
			require.NoError(t, err, "%s=%q", v.Name, v.Example)
			fields := changedFields(base, only)
			require.NotEmpty(t, fields, "%s=%q changes nothing in the %s's configuration", v.Name, v.Example, sc.name)
			for _, f := range fields {
				require.Equal(t, field(all, f), field(running, f),
					"%s sets %s.%s, but the %s running under toolwire dev has another value", v.Name, sc.name, f, sc.name)
			}
			checked++
		}
	}
	require.Equal(t, len(env), checked, "every variable is some service's")
	require.True(t, slices.ContainsFunc(serviceConfigs(), func(sc serviceConfig) bool { return len(sc.vars) > 0 }))
}
