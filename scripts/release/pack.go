package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// pack writes every module at version into dir, laid out as a module proxy
// (GOPROXY=file://dir): <path>/@v/{list,<version>.info,.mod,.zip}. A module
// holds the files git tracks or would track (not ignored), without those of
// the modules nested in it; its sibling requirements are set to version.
func (ws *workspace) pack(dir, version string) error {
	for _, m := range ws.modules {
		gomod, err := ws.modAt(m, version)
		if err != nil {
			return err
		}
		files, err := ws.moduleFiles(m, gomod)
		if err != nil {
			return err
		}
		esc, err := module.EscapePath(m.path)
		if err != nil {
			return err
		}
		vdir := filepath.Join(dir, esc, "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		var zb bytes.Buffer
		if err := modzip.Create(&zb, module.Version{Path: m.path, Version: version}, files); err != nil {
			return fmt.Errorf("pack %s: %w", m.rel, err)
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    time.Time
		}{version, time.Now().UTC().Truncate(time.Second)})
		for name, b := range map[string][]byte{
			version + ".zip": zb.Bytes(), version + ".mod": gomod, version + ".info": info, "list": []byte(version + "\n"),
		} {
			if err := os.WriteFile(filepath.Join(vdir, name), b, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// modAt is m's go.mod with its siblings required at version.
func (ws *workspace) modAt(m mod, version string) ([]byte, error) {
	f, err := ws.readMod(m)
	if err != nil {
		return nil, err
	}
	for _, r := range f.Require {
		if ws.isSibling(r.Mod.Path) {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return nil, err
			}
		}
	}
	f.Cleanup()
	return f.Format()
}

// moduleFiles are m's files: tracked or untracked but not ignored, outside
// the directories of nested modules, with go.mod replaced by gomod.
func (ws *workspace) moduleFiles(m mod, gomod []byte) ([]modzip.File, error) {
	out, err := exec.Command("git", "-C", m.dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard", ".").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", m.rel, err)
	}
	var nested []string
	for _, o := range ws.modules {
		if o.dir != m.dir && strings.HasPrefix(o.dir, m.dir+string(filepath.Separator)) {
			rel, _ := filepath.Rel(m.dir, o.dir)
			nested = append(nested, filepath.ToSlash(rel)+"/")
		}
	}
	var files []modzip.File
	seen := map[string]bool{}
	for _, p := range strings.Split(string(out), "\x00") {
		if p == "" || seen[p] {
			continue
		}
		seen[p] = true
		skip := false
		for _, n := range nested {
			if strings.HasPrefix(p, n) {
				skip = true
			}
		}
		if skip {
			continue
		}
		abs := filepath.Join(m.dir, filepath.FromSlash(p))
		fi, err := os.Lstat(abs)
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree, not yet in the index
			}
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		if p == "go.mod" {
			files = append(files, memFile{path: p, data: gomod, info: fi})
			continue
		}
		files = append(files, diskFile{path: p, abs: abs, info: fi})
	}
	return files, nil
}

type diskFile struct {
	path, abs string
	info      fs.FileInfo
}

func (f diskFile) Path() string                 { return f.path }
func (f diskFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

type memFile struct {
	path string
	data []byte
	info fs.FileInfo
}

func (f memFile) Path() string                { return f.path }
func (f memFile) Lstat() (fs.FileInfo, error) { return sizedInfo{f.info, int64(len(f.data))}, nil }
func (f memFile) Open() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.data)), nil
}

type sizedInfo struct {
	fs.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }

// moduleGraphPaths are the module paths `go mod graph` names in dir.
func moduleGraphPaths(graph string) map[string]bool {
	paths := map[string]bool{}
	for _, line := range strings.Split(graph, "\n") {
		for _, f := range strings.Fields(line) {
			p, _, _ := strings.Cut(f, "@")
			paths[p] = true
		}
	}
	return paths
}
