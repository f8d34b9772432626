package buildctx

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writeTree makes the files (slash paths) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
}

func TestLoadKeepsWhatDockerignoreKeeps(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		".dockerignore": "# comment\n.git\n/bin/\n**/*.log\ndeep\n!deep/dir/file\n",
		".git/config":   "x",
		"a.go":          "package a",
		"bin/tool":      "binary",
		"sub/keep.txt":  "k",
		"sub/drop.log":  "d",
		"sub/bin/x":     "not the root's bin/",
		"deep/other":    "o",
		"deep/dir/file": "re-included",
	})
	c, err := Load(root)
	require.NoError(t, err)
	require.Equal(t, []string{".git", "bin", "**/*.log", "deep", "!deep/dir/file"}, c.Patterns,
		"ignorefile strips comments, leading and trailing slashes")
	require.Equal(t, []string{".dockerignore", "a.go", "deep/dir/file", "sub/bin/x", "sub/keep.txt"}, c.Files)

	require.True(t, c.Has("deep"), "a directory holding a re-included file is in the context")
	require.True(t, c.Has("/sub/keep.txt"), "paths may start with a slash, as COPY sources do")
	require.False(t, c.Has("bin"))
	require.False(t, c.Has("deep/other"))
	require.False(t, c.Has("sub/drop.log"))
	require.True(t, c.IsDir("sub"))
	require.False(t, c.IsDir("a.go"))

	got, err := c.Glob("sub/*")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/bin", "sub/keep.txt"}, got)
	require.Equal(t, []string{"sub/bin/x", "sub/keep.txt"}, c.Under("sub"))

	dst := t.TempDir()
	require.NoError(t, c.CopyTo(dst))
	b, err := os.ReadFile(filepath.Join(dst, "deep", "dir", "file"))
	require.NoError(t, err)
	require.Equal(t, "re-included", string(b))
	_, err = os.Stat(filepath.Join(dst, "bin", "tool"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Error(t, c.CopyFile("bin/tool", filepath.Join(dst, "x")), "an excluded file is not copied")
}

func TestLoadWithoutDockerignoreKeepsEverything(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"a": "1", "d/b": "2"})
	c, err := Load(root)
	require.NoError(t, err)
	require.Empty(t, c.Patterns)
	require.Equal(t, []string{"a", "d/b"}, c.Files)
}

func TestLoadRefusesABadPattern(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{".dockerignore": "[\n"})
	_, err := Load(root)
	require.Error(t, err)
}
