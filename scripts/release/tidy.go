package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tidy runs `go mod tidy` in every module as a dependent would see it
// (GOWORK=off), with the siblings served from the checkout by a file-based
// proxy at the release version, until no go.mod changes. go.sum keeps no
// line of a sibling: their sums are those of the release's zips, which the
// proxy and the checksum database serve once it is tagged.
func (ws *workspace) tidy(ctx context.Context) (err error) {
	if err := ws.requireImportedSiblings(ctx); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "toolwire-tidy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	defer func() { err = errors.Join(err, purgeModCache(ctx)) }()
	// Each pass packs the checkout at a version of its own: the go command
	// indexes a module's files by path and version (in the build cache) and
	// never looks again, so a version packed twice would be read as the
	// first pack had it. The go.mod files require that version while tidy
	// runs, and the release version again after.
	defer func() {
		for _, m := range ws.modules {
			err = errors.Join(err, ws.rewriteMod(m, ws.version))
		}
	}()
	stamp := time.Now().Unix()
	for pass := 1; pass <= 4; pass++ {
		before := ws.modFiles()
		version := fmt.Sprintf("%s-tidy.%d.%d", ws.version, stamp, pass)
		proxy := filepath.Join(tmp, fmt.Sprintf("proxy%d", pass))
		if err := ws.pack(proxy, version); err != nil {
			return err
		}
		env := dependentEnv(proxy)
		for _, m := range ws.modules {
			if err := ws.rewriteMod(m, version); err != nil {
				return err
			}
			fmt.Printf("==> pass %d: go mod tidy in %s\n", pass, m.rel)
			if err := goCmd(ctx, m.dir, env, "mod", "tidy"); err != nil {
				return fmt.Errorf("%s: %w", m.rel, err)
			}
			if err := ws.rewriteMod(m, ws.version); err != nil {
				return err
			}
			if err := ws.stripSiblingSums(m); err != nil {
				return err
			}
		}
		if after := ws.modFiles(); after == before {
			fmt.Printf("==> every go.mod is tidy (%d passes)\n", pass)
			return nil
		}
	}
	return fmt.Errorf("go.mod files still change after 4 passes of go mod tidy")
}

// requireImportedSiblings adds, to every module, a requirement at the
// release version of each sibling whose packages it or its tests import, so
// that tidy finds them in the proxy rather than looking them up.
func (ws *workspace) requireImportedSiblings(ctx context.Context) error {
	for _, m := range ws.modules {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "go", "list", "-e", "-deps", "-test", "-f", "{{with .Module}}{{.Path}}{{end}}", "./...")
		cmd.Dir, cmd.Stdout, cmd.Stderr = m.dir, &out, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go list in %s: %w", m.rel, err)
		}
		f, err := ws.readMod(m)
		if err != nil {
			return err
		}
		need := map[string]bool{}
		for _, p := range strings.Fields(out.String()) {
			if p != m.path && ws.isSibling(p) {
				need[p] = true
			}
		}
		var paths []string
		for p := range need {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			if err := f.AddRequire(p, ws.version); err != nil {
				return err
			}
		}
		f.Cleanup()
		b, err := f.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(m.dir, "go.mod"), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (ws *workspace) modFiles() string {
	var b strings.Builder
	for _, m := range ws.modules {
		data, _ := os.ReadFile(filepath.Join(m.dir, "go.mod"))
		b.Write(data)
	}
	return b.String()
}

// stripSiblingSums drops the go.sum lines of sibling modules.
func (ws *workspace) stripSiblingSums(m mod) error {
	name := filepath.Join(m.dir, "go.sum")
	b, err := os.ReadFile(name)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var out strings.Builder
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 0 && ws.isSibling(f[0]) {
			continue
		}
		out.WriteString(line)
	}
	if out.Len() == 0 {
		return os.Remove(name)
	}
	return os.WriteFile(name, []byte(out.String()), 0o644)
}

// dependentEnv is the environment of a module outside the checkout that
// finds toolwire's modules in the file-based proxy at dir first.
func dependentEnv(proxyDir string) []string {
	upstream := strings.TrimSpace(goEnv("GOPROXY"))
	if upstream == "" {
		upstream = "https://proxy.golang.org,direct"
	}
	env := []string{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOWORK", "GOPROXY", "GONOSUMDB", "GOFLAGS", "GOPRIVATE", "GONOPROXY":
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"GOWORK=off",
		"GOPROXY=file://"+filepath.ToSlash(proxyDir)+","+upstream,
		// The checksum database has never seen these zips.
		"GONOSUMDB="+modulePrefix,
		"GOFLAGS=-modcacherw -buildvcs=false",
	)
}

func goEnv(name string) string {
	out, _ := exec.Command("go", "env", name).Output()
	return string(out)
}

func goCmd(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

func goOutput(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

// purgeModCache removes toolwire's modules from the module cache: a version
// packed from the checkout must never be served from a copy extracted from
// an earlier pack of the same version.
func purgeModCache(context.Context) error {
	cache := strings.TrimSpace(goEnv("GOMODCACHE"))
	if cache == "" {
		return nil
	}
	for _, d := range []string{
		filepath.Join(cache, filepath.FromSlash(modulePrefix)),
		filepath.Join(cache, "cache", "download", filepath.FromSlash(modulePrefix)),
	} {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("purge %s from the module cache: %w", d, err)
		}
	}
	return nil
}
