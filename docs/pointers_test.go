package docs_test

import (
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// thisFile is skipped by the pointer checks: it names the patterns it bans.
const thisFile = "docs/pointers_test.go"

// outsidePointer matches a pointer at a document that is not in the
// repository: the design map (DESIGN.md), the seeds the specification came
// from (seeds/000_...), and the specification's section numbers ("spec 5.1",
// "spec 4c", "spec §3", "(spec\n// 6.4)" across a comment's lines, "(spec:
// tool health)"). What such a comment relies on belongs in docs/, and the
// comment points there.
var outsidePointer = regexp.MustCompile(`(?i)DESIGN\.md|\bseeds?/[0-9]|\bspec(?:ification)?\s*(?://\s*)?§?\s*[0-9]+(?:\.[0-9]+)*[a-z]?\b|\(spec[:)]`)

// repoTextFiles returns the repository's source and documentation files (Go,
// Markdown, JSON, YAML), relative to its root, but for the changelog (which
// may name what is gone) and this file.
func repoTextFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	require.NoError(t, filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".toolwire", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch filepath.Ext(rel) {
		case ".go", ".md", ".json", ".yaml", ".yml":
		default:
			return nil
		}
		if rel != thisFile && rel != "CHANGELOG.md" {
			files = append(files, rel)
		}
		return nil
	}))
	require.Contains(t, files, "pkg/envelope/toolenvelope.go")
	return files
}

// TestDocsNoPointersOutsideTheRepository: no Go file (tests included), page,
// schema or API document points at DESIGN.md, a seeds/ file or a section of
// the specification, none of which a reader of the repository has. State the
// fact in the right page of docs/ (docs/architecture.md for the contracts,
// subjects and guarantees) and point there: "docs/architecture.md, Contracts".
func TestDocsNoPointersOutsideTheRepository(t *testing.T) {
	for _, name := range repoTextFiles(t) {
		text := readDoc(t, name)
		for _, loc := range outsidePointer.FindAllStringIndex(text, -1) {
			line := 1 + strings.Count(text[:loc[0]], "\n")
			t.Errorf("%s:%d points outside the repository (%q): state the fact in docs/ and point there",
				name, line, text[loc[0]:loc[1]])
		}
	}
}

// commentBreak joins a comment's lines, so that a pointer broken across two
// of them reads as one.
var commentBreak = regexp.MustCompile(`\n[ \t]*//[ \t]?`)

// docsPointer matches a pointer at a section of a page of docs/:
// "docs/tools.md, Cache", "docs/operations.md: Who may publish what" or
// "docs/architecture.md (Events)", capturing the page and the text from the
// section's name on (up to a parenthesis, a semicolon, a quote or the line's
// end). A lowercase word after the page ("docs/architecture.md, which ...")
// is prose, not a section.
var docsPointer = regexp.MustCompile("docs/([a-z][a-z0-9-]*\\.md)(?:, |: | \\()([A-Z][^;()\"`\n]*)")

// heading matches a Markdown heading, capturing its text.
var heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*$`)

// normalHeading is a heading's or a pointer's text as the two are compared:
// lowercase, without code spans' backticks.
func normalHeading(s string) string {
	return strings.ToLower(strings.TrimSpace(strings.ReplaceAll(s, "`", "")))
}

// TestDocsPointersNameSections: every pointer of a Go file at a section of
// docs/ ("docs/tools.md, Cache") names a page that exists and starts with the
// name of one of its headings, so that renaming or removing a section breaks
// a test, not the comments that point at it.
func TestDocsPointersNameSections(t *testing.T) {
	headings := map[string][]string{}
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	for _, p := range pages {
		text := fence.ReplaceAllString(readDoc(t, "docs/"+filepath.Base(p)), "")
		for _, m := range heading.FindAllStringSubmatch(text, -1) {
			headings[filepath.Base(p)] = append(headings[filepath.Base(p)], normalHeading(m[1]))
		}
	}
	require.NotEmpty(t, headings["architecture.md"])
	for _, name := range repoTextFiles(t) {
		if !strings.HasSuffix(name, ".go") {
			continue
		}
		text := commentBreak.ReplaceAllString(readDoc(t, name), " ")
		for _, m := range docsPointer.FindAllStringSubmatch(text, -1) {
			page, section := m[1], normalHeading(m[2])
			hs, ok := headings[page]
			if !ok {
				t.Errorf("%s points at docs/%s, which does not exist", name, page)
				continue
			}
			found := false
			for _, h := range hs {
				if strings.HasPrefix(section, h) && (len(section) == len(h) || !isWordByte(section[len(h)])) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s points at docs/%s, %q: the page has no such section (its sections: %s)",
					name, page, strings.TrimSpace(m[2]), strings.Join(hs, "; "))
			}
		}
	}
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '\'' || c == '-'
}
