package docs_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = ".."

// markdownFiles returns the Markdown files the docs tests read, relative to
// the repository's root: the root's own (README.md, CONTRIBUTING.md, ...)
// and those of docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.md", "docs/*.md"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, pattern))
		require.NoError(t, err)
		for _, f := range m {
			rel, err := filepath.Rel(repoRoot, f)
			require.NoError(t, err)
			files = append(files, filepath.ToSlash(rel))
		}
	}
	require.Contains(t, files, "README.md")
	require.Contains(t, files, "docs/architecture.md")
	return files
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(name)))
	require.NoError(t, err)
	return string(b)
}

// fence matches a fenced code block, which holds code, not links.
var fence = regexp.MustCompile("(?ms)^[ \t]*```.*?^[ \t]*```[ \t]*$")

// inlineCode matches a code span.
var inlineCode = regexp.MustCompile("`[^`\n]*`")

// mdLink matches an inline link or image, [text](target "title"), capturing
// the target.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// TestDocsLinksResolve: every relative link of the README, the root's other
// Markdown files and docs/ names a file or directory of the repository (the
// part after a '#' is not checked), so that moving a page or a file breaks
// a test, not a reader's click.
func TestDocsLinksResolve(t *testing.T) {
	for _, name := range markdownFiles(t) {
		text := inlineCode.ReplaceAllString(fence.ReplaceAllString(readDoc(t, name), ""), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			resolved := path.Join(path.Dir(name), target)
			if resolved == ".." || strings.HasPrefix(resolved, "../") {
				t.Errorf("%s links to %s, outside the repository", name, m[1])
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(resolved))); err != nil {
				t.Errorf("%s links to %s: %s does not exist", name, m[1], resolved)
			}
		}
	}
}

// goPath matches what could name a Go file: a run of path characters.
var goPath = regexp.MustCompile(`[A-Za-z0-9_./-]+`)

// TestDocsCiteExistingGoFiles: every Go file the README, the root's other
// Markdown files (but the changelog, which may name files that are gone) and
// docs/ name exists: a path (e2e/stack/orchestrator_test.go) at that path from the
// repository's root, or from the page when it starts with ./ or ../; a bare
// name (table.go) somewhere in the repository. Module paths
// (github.com/nats-io/nats.go) are not files.
func TestDocsCiteExistingGoFiles(t *testing.T) {
	names := map[string]bool{}
	require.NoError(t, filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".toolwire") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			names[d.Name()] = true
		}
		return nil
	}))
	for _, name := range markdownFiles(t) {
		if name == "CHANGELOG.md" {
			continue
		}
		for _, tok := range goPath.FindAllString(readDoc(t, name), -1) {
			tok = strings.TrimRight(tok, ".")
			base := path.Base(tok)
			if !strings.HasSuffix(tok, ".go") || strings.Contains(tok, "//") || base == ".go" || strings.HasPrefix(base, "_") {
				continue // not a file's name: a URL, ".go", the "_test.go" of "*_test.go"
			}
			first, _, isPath := strings.Cut(strings.TrimPrefix(tok, "./"), "/")
			if !isPath {
				if !names[tok] {
					t.Errorf("%s names %s: no file of that name in the repository", name, tok)
				}
				continue
			}
			if first != ".." && strings.Contains(first, ".") {
				continue // a module path: github.com/..., code.dny.dev/...
			}
			p := tok
			if strings.HasPrefix(tok, "./") || strings.HasPrefix(tok, "../") {
				p = path.Join(path.Dir(name), tok)
			}
			if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(p))); err != nil {
				t.Errorf("%s names %s: %s does not exist", name, tok, p)
			}
		}
	}
}

// TestDocsChecklistsAgree: CONTRIBUTING.md and docs/architecture.md carry
// the same checklists (adding an event type, a tool, a rule, a route), so
// that a contributor and a reader of the design follow the same steps.
func TestDocsChecklistsAgree(t *testing.T) {
	block := func(name string) string {
		t.Helper()
		doc := readDoc(t, name)
		const begin, end = "<!-- checklists -->\n", "<!-- end:checklists -->"
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		require.True(t, i >= 0 && j > i, "%s has no %q ... %q section", name, strings.TrimSpace(begin), end)
		return doc[i+len(begin) : j]
	}
	require.Equal(t, block("docs/architecture.md"), block("CONTRIBUTING.md"),
		"the checklists of CONTRIBUTING.md and docs/architecture.md differ: copy the one you changed over the other")
}
