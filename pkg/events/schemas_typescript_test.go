package events_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSchemasGenerateTypeScript runs json-schema-to-typescript over every schema
// file of pkg/envelope/schemas and pkg/events/schemas, read from disk with the
// network shut off, and compiles what it writes with tsc --strict: a client can
// generate its types from the files alone. The generator and the compiler are
// the pinned npm packages of scripts/schema-ts, installed by
// scripts/npm-install.sh; without them (or node) the test fails when CI=true
// and is skipped otherwise.
func TestSchemasGenerateTypeScript(t *testing.T) {
	root, node := schemaTSTools(t)

	// The files on disk are the embedded ones, all of them.
	tree := schemaTree(t)
	var files, disk []string
	for _, dir := range []string{"envelope/schemas", "events/schemas"} {
		matches, err := filepath.Glob(filepath.Join(root, "pkg", filepath.FromSlash(dir), "*.schema.json"))
		require.NoError(t, err)
		for _, m := range matches {
			files = append(files, m)
			disk = append(disk, dir+"/"+filepath.Base(m))
		}
	}
	embedded := make([]string, 0, len(tree))
	for p := range tree {
		embedded = append(embedded, p)
	}
	sort.Strings(disk)
	sort.Strings(embedded)
	require.Equal(t, embedded, disk, "the schema files on disk are the embedded ones")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := t.TempDir()
	gen := exec.CommandContext(ctx, node, append([]string{filepath.Join(root, "scripts", "schema-ts", "gen.mjs"), out}, files...)...)
	gen.Dir = root
	b, err := gen.CombinedOutput()
	require.NoError(t, err, "json-schema-to-typescript:\n%s", b)
	t.Logf("%s", b)

	generated := map[string]string{}
	for _, p := range disk {
		name := strings.TrimSuffix(path.Base(p), ".schema.json")
		ts, err := os.ReadFile(filepath.Join(out, name+".ts"))
		require.NoError(t, err, "no TypeScript for %s", p)
		generated[p] = string(ts)
	}

	// What a file references elsewhere is resolved into its output, from disk:
	// every titled target of a $ref to another file is declared there.
	checked := 0
	for p, raw := range tree {
		var doc any
		require.NoError(t, json.Unmarshal(raw, &doc))
		for _, ref := range schemaRefs(doc) {
			u, err := url.Parse(ref)
			require.NoError(t, err)
			if u.Path == "" {
				continue // within the file
			}
			target := path.Join(path.Dir(p), u.Path)
			var targetDoc any
			require.NoError(t, json.Unmarshal(tree[target], &targetDoc), "%s: $ref %q", p, ref)
			node, ok := lookupPointer(targetDoc, u.Fragment)
			require.True(t, ok, "%s: $ref %q", p, ref)
			title, _ := node.(map[string]any)["title"].(string)
			if title == "" {
				continue // inlined: nothing to name
			}
			decl := regexp.MustCompile(`(?m)^export (interface|type) ` + regexp.QuoteMeta(tsTypeName(title)) + `\b`)
			require.Regexp(t, decl, generated[p], "%s: $ref %q: no declaration of %s (from %s)", p, ref, tsTypeName(title), target)
			checked++
		}
	}
	require.Greater(t, checked, 10, "titled targets of $refs to other files")
	t.Logf("%d $refs to titled schemas of other files, each declared in the referencing file's output", checked)
	for p, want := range map[string][]string{
		"events/schemas/event_run_status.schema.json": {"RunStatus", "Turn", "AgentOutputs", "ToolEnvelope", "ToolError", "Tenant", "Attachment"},
		"events/schemas/event_turn.schema.json":       {"Turn", "Tenant", "ModelResponse", "Policy"},
		"envelope/schemas/replay_bundle.schema.json":  {"ReplayBundle", "RunRequest", "ToolDefinition", "ToolEnvelope", "AgentOutputs", "PinnedHandle"},
	} {
		for _, name := range want {
			require.Regexp(t, `(?m)^export (interface|type) `+name+`\b`, generated[p], "%s declares %s", p, name)
		}
	}

	// tsc --strict over the output. --lib es2020 leaves out the DOM's
	// declarations, which the types do not use and which are most of tsc's
	// time; the run is in the output folder, so no @types package is read.
	var ts []string
	for _, p := range disk {
		ts = append(ts, strings.TrimSuffix(path.Base(p), ".schema.json")+".ts")
	}
	tsc := exec.CommandContext(ctx, node, append([]string{
		filepath.Join(root, "scripts", "schema-ts", "node_modules", "typescript", "bin", "tsc"),
		"--strict", "--noEmit", "--lib", "es2020", "--skipLibCheck", "--pretty", "false",
	}, ts...)...)
	tsc.Dir = out
	b, err = tsc.CombinedOutput()
	require.NoError(t, err, "tsc --strict:\n%s", b)
}

// schemaTSTools finds the repository root and node, with the npm packages of
// scripts/schema-ts installed; it fails the test in CI when they are missing
// and skips it elsewhere.
func schemaTSTools(t *testing.T) (root, node string) {
	t.Helper()
	const install = "run scripts/npm-install.sh (npm ci in scripts/schema-ts)"
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format+"; CI must not skip this test", args...)
		}
		t.Skipf(format, args...)
	}
	wd, err := os.Getwd()
	require.NoError(t, err)
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "schema-ts", "package.json")); err == nil {
			root = dir
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			missing("no scripts/schema-ts/package.json above %s: run the test in a checkout of the repository", wd)
			return "", ""
		}
		dir = parent
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH (%v): install Node.js and npm (Debian: apt-get install nodejs npm), then %s", err, install)
		return "", ""
	}
	for _, f := range []string{
		"node_modules/json-schema-to-typescript/package.json",
		"node_modules/typescript/bin/tsc",
	} {
		if _, err := os.Stat(filepath.Join(root, "scripts", "schema-ts", filepath.FromSlash(f))); err != nil {
			missing("scripts/schema-ts/%s is not installed: %s", f, install)
			return "", ""
		}
	}
	return root, node
}

// schemaRefs lists every $ref of a schema document.
func schemaRefs(node any) []string {
	var out []string
	switch n := node.(type) {
	case map[string]any:
		if ref, ok := n["$ref"].(string); ok {
			out = append(out, ref)
		}
		for _, v := range n {
			out = append(out, schemaRefs(v)...)
		}
	case []any:
		for _, v := range n {
			out = append(out, schemaRefs(v)...)
		}
	}
	return out
}

// tsTypeName is the name json-schema-to-typescript gives a titled schema: the
// title's letters and digits, from an upper-case letter.
func tsTypeName(title string) string {
	var b strings.Builder
	upper := true
	for _, r := range title {
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9':
			if upper {
				r = []rune(strings.ToUpper(string(r)))[0]
			}
			b.WriteRune(r)
			upper = false
		default:
			upper = true
		}
	}
	return b.String()
}
