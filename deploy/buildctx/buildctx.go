// Package buildctx computes the build context that `docker build <dir>`
// sends: the files of the directory that its .dockerignore keeps, matched with
// Docker's own code (github.com/moby/patternmatcher and its ignorefile reader,
// which the docker CLI and BuildKit use), walking the tree the way BuildKit
// does: an excluded directory is skipped unless a "!" pattern may keep
// something below it.
package buildctx

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// IgnoreFile is the name of the file that trims the context.
const IgnoreFile = ".dockerignore"

// Context is the build context of one directory.
type Context struct {
	// Root is the directory.
	Root string
	// Patterns are the .dockerignore patterns as Docker reads them.
	Patterns []string
	// Files are the regular files and symlinks kept, as slash-separated
	// paths relative to Root, sorted.
	Files []string

	files map[string]bool
	dirs  map[string]bool // directories in the context: kept ones and parents of kept files
}

// Load reads root's .dockerignore (none means everything is kept) and walks root.
func Load(root string) (*Context, error) {
	c := &Context{Root: root, files: map[string]bool{}, dirs: map[string]bool{".": true}}
	fh, err := os.Open(filepath.Join(root, IgnoreFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		c.Patterns, err = ignorefile.ReadAll(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", IgnoreFile, err)
		}
	}
	pm, err := patternmatcher.New(c.Patterns)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", IgnoreFile, err)
	}
	infos := map[string]patternmatcher.MatchInfo{".": {}}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		excluded, info, err := pm.MatchesUsingParentResults(rel, infos[path.Dir(rel)])
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if d.IsDir() {
			if excluded && !pm.Exclusions() {
				return filepath.SkipDir
			}
			infos[rel] = info
			if !excluded {
				c.dirs[rel] = true
			}
			return nil
		}
		if excluded {
			return nil
		}
		c.files[rel] = true
		c.Files = append(c.Files, rel)
		for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
			c.dirs[dir] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(c.Files)
	return c, nil
}

// Has reports whether rel (slash-separated, relative to Root) is a file or a
// directory of the context.
func (c *Context) Has(rel string) bool {
	rel = path.Clean(strings.TrimPrefix(rel, "/"))
	return c.files[rel] || c.dirs[rel]
}

// IsDir reports whether rel is a directory of the context.
func (c *Context) IsDir(rel string) bool {
	return c.dirs[path.Clean(strings.TrimPrefix(rel, "/"))]
}

// Glob returns the context's files and directories that match pattern
// (path.Match syntax, slash-separated, relative to Root), sorted.
func (c *Context) Glob(pattern string) ([]string, error) {
	pattern = path.Clean(strings.TrimPrefix(pattern, "/"))
	var out []string
	for _, set := range []map[string]bool{c.files, c.dirs} {
		for p := range set {
			ok, err := path.Match(pattern, p)
			if err != nil {
				return nil, fmt.Errorf("pattern %q: %w", pattern, err)
			}
			if ok {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Under returns the context's files below directory dir ("." for all).
func (c *Context) Under(dir string) []string {
	dir = path.Clean(strings.TrimPrefix(dir, "/"))
	if dir == "." {
		return c.Files
	}
	var out []string
	for _, f := range c.Files {
		if strings.HasPrefix(f, dir+"/") {
			out = append(out, f)
		}
	}
	return out
}

// CopyFile copies the context's file rel to dst (a path on disk), making
// dst's directory; a symlink is copied as a symlink.
func (c *Context) CopyFile(rel, dst string) error {
	if !c.files[rel] {
		return fmt.Errorf("%s is not in the build context", rel)
	}
	return copyFile(filepath.Join(c.Root, filepath.FromSlash(rel)), dst)
}

// CopyTo copies every file of the context into dir, keeping paths and modes.
func (c *Context) CopyTo(dir string) error {
	for _, f := range c.Files {
		if err := c.CopyFile(f, filepath.Join(dir, filepath.FromSlash(f))); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) (err error) {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	_, err = io.Copy(out, in)
	return err
}
