package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionString(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "561d0fa0123456789abcdef0123456789abcdef0"},
		{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"a release", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/toolwire/toolwire", Version: "v0.1.0"}},
			true, "v0.1.0 (go1.26.8)"},
		{"a checkout with its revision", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			true, "devel (revision 561d0fa01234, 2026-12-01T10:00:00Z, go1.26.8)"},
		{"a modified checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: append(vcs[:len(vcs):len(vcs)], debug.BuildSetting{Key: "vcs.modified", Value: "true"})},
			true, "devel (revision 561d0fa01234-modified, 2026-12-01T10:00:00Z)"},
		{"a pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20261201100000-561d0fa01234"}},
			true, "v0.1.1-0.20261201100000-561d0fa01234"},
		{"no version, no settings", &debug.BuildInfo{}, true, "devel"},
		{"no build information", nil, false, "unknown (no build information)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, versionString(tc.info, tc.ok))
		})
	}
}

// TestVersionCommand: toolwire version and toolwire --version print the
// build's version, the same.
func TestVersionCommand(t *testing.T) {
	want := "toolwire " + buildVersion() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, err := runCLI(t, "", args...)
		require.NoError(t, err)
		require.Equal(t, want, out, "%v", args)
	}
	_, _, err := runCLI(t, "", "version", "extra")
	require.Equal(t, exitUsage, exitCode(err), "%v", err)
}
