package main

import (
	"runtime/debug"
	"strings"
)

// versionString is what `toolwire version` and `toolwire --version` print:
// the module's version from the build information (a release's tag when
// installed with `go install ...@v0.1.0`), "devel" for a build of a checkout
// (go run, go build: the toolchain says "(devel)"), and the VCS revision,
// its time and "modified" when the build recorded them.
func versionString(info *debug.BuildInfo, ok bool) string {
	if !ok || info == nil {
		return "unknown (no build information)"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	var extra []string
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified {
			rev += "-modified"
		}
		extra = append(extra, "revision "+rev)
	}
	if at != "" {
		extra = append(extra, at)
	}
	if info.GoVersion != "" {
		extra = append(extra, info.GoVersion)
	}
	if len(extra) > 0 {
		v += " (" + strings.Join(extra, ", ") + ")"
	}
	return v
}

// buildVersion is versionString of this binary's build information.
func buildVersion() string { return versionString(debug.ReadBuildInfo()) }
