package docs_test

import (
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// godocExamples are the godoc examples of issue 28 (item 6), by directory
// from the repository's root: client submit + follow (here, in stack: it
// needs the pipeline), stack.Start, a worker tested with workertest, pinned
// handles, CallID and the rules guard; and the others beside them.
var godocExamples = map[string][]string{
	"pkg/envelope":      {"CallID", "ResolvePins"},
	"pkg/rules":         {"Guard_CheckCall", "Guard_CheckLoop", "Gates_For"},
	"stack":             {"Start", "Stack_submitAndFollow"},
	"worker":            {"Func", "WithPreview", "Worker_Start"},
	"worker/workertest": {"Start"},
}

// TestGodocExamples fails when one of those examples is gone, or has no
// output to check, so that go test would compile it but never run it. (go
// vet checks that each names an identifier that exists.) It reads the other
// packages' example_test.go from the repository, as TestDocTablesAreCurrent
// reads docs/operations.md.
func TestGodocExamples(t *testing.T) {
	for dir, want := range godocExamples {
		path := filepath.Join("..", filepath.FromSlash(dir), "example_test.go")
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		require.NoError(t, err)
		got := map[string]*doc.Example{}
		for _, ex := range doc.Examples(f) {
			got[ex.Name] = ex
		}
		for _, name := range want {
			ex := got[name]
			require.NotNil(t, ex, "%s: Example%s is missing", path, name)
			require.NotEmpty(t, ex.Output, "%s: Example%s has no // Output: to check, so go test does not run it", path, name)
		}
	}
}
