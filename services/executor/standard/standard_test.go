package standard_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// The standard families through the executor (web, http, MCP and sandbox
// entries, the built-ins) are tested by package executor's tests, which run
// the executor with them.

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    func(t *testing.T, c standard.Config)
		wantErr []string
	}{
		{name: "defaults", env: nil, want: func(t *testing.T, c standard.Config) { require.Equal(t, standard.Config{}, c) }},
		{
			name: "web tools",
			env:  map[string]string{web.EnvAllowHosts: "a:1, b", web.EnvMaxResponseBytes: "4096"},
			want: func(t *testing.T, c standard.Config) {
				require.Equal(t, []string{"a:1", "b"}, c.Web.AllowHosts)
				require.EqualValues(t, 4096, c.Web.MaxResponseBytes)
			},
		},
		{
			name:    "web tools refused",
			env:     map[string]string{web.EnvAllowHosts: "ok:1,bad:0", web.EnvMaxResponseBytes: "-3"},
			wantErr: []string{"bad:0", web.EnvMaxResponseBytes},
		},
		{
			name: "what MCP servers inherit",
			env:  map[string]string{"PATH": "/bin", "HOME": "/home/x", "NATS_URL": "nats://secret@x"},
			want: func(t *testing.T, c standard.Config) {
				require.Equal(t, []string{"PATH=/bin", "HOME=/home/x"}, c.MCPEnv)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := standard.ConfigFromEnv(func(k string) string { return tc.env[k] })
			if len(tc.wantErr) > 0 {
				require.Error(t, err)
				for _, s := range tc.wantErr {
					require.ErrorContains(t, err, s)
				}
				return
			}
			require.NoError(t, err)
			tc.want(t, c)
		})
	}
}

func TestEnvVars(t *testing.T) {
	servicetest.VarsTakeEffect(t, standard.FamilyEnvVars(), standard.ConfigFromEnv)
	// The binary's documented variables: the executor's and the families'.
	var names []string
	for _, v := range standard.EnvVars() {
		names = append(names, v.Name)
	}
	for _, v := range append(executor.EnvVars(), standard.FamilyEnvVars()...) {
		require.Contains(t, names, v.Name)
	}
	require.Contains(t, names, web.EnvAllowHosts)
	require.Contains(t, names, "PATH")
}

// TestWithConfig: the options set the standard families of a configuration,
// once, whatever else it has.
func TestWithConfig(t *testing.T) {
	c := executor.Config{}.With(standard.WithConfig(standard.Config{MCPEnv: []string{"PATH=/bin"}}),
		standard.WithWebConfig(web.Config{AllowHosts: []string{"a:1"}}))
	require.Len(t, c.Families, 1)
	got := c.Families[0].(*standard.Family).Config()
	require.Equal(t, standard.Config{Web: web.Config{AllowHosts: []string{"a:1"}}, MCPEnv: []string{"PATH=/bin"}}, got)
	c = executor.Config{}.With(standard.WithWebConfig(web.Config{MaxRedirects: 3}))
	require.Len(t, c.Families, 1, "WithWebConfig adds the families when there are none")
}
