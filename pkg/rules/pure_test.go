package rules_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rules stay pure, so that the orchestrator and the policy service can
// run them anywhere and judge alike: the package imports pkg/envelope and
// the standard library, and none of the standard library's I/O.
func TestRulesArePure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	io := []string{"os", "os/exec", "net", "net/http", "io/fs", "io/ioutil", "syscall", "unsafe", "time", "math/rand", "math/rand/v2", "crypto/rand", "log", "log/slog", "runtime", "sync"}
	fset := token.NewFileSet()
	var checked int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		require.NoError(t, err)
		for _, spec := range f.Imports {
			path, err := strconv.Unquote(spec.Path.Value)
			require.NoError(t, err)
			std := !strings.Contains(strings.Split(path, "/")[0], ".")
			require.True(t, std || path == "github.com/toolwire/toolwire/pkg/envelope",
				"%s imports %s: the rules import only pkg/envelope and the standard library", name, path)
			require.False(t, slices.Contains(io, path), "%s imports %s: the rules do no I/O and read no clock", name, path)
		}
		checked++
	}
	require.Positive(t, checked)
}
