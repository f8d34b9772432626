package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// modulePrefix is the path every toolwire module starts with.
const modulePrefix = "github.com/toolwire/toolwire"

// A workspace is the checkout's modules, as go.work lists them.
type workspace struct {
	root    string
	modules []mod
	// version is the release version go.work points at the checkout.
	version string
}

type mod struct {
	path string // module path
	dir  string // absolute
	rel  string // relative to the root, "." for the root module
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOWORK: %w", err)
	}
	gowork := strings.TrimSpace(string(out))
	if gowork == "" || gowork == "off" {
		return "", errors.New("run it inside the checkout, with its go.work (GOWORK unset)")
	}
	return filepath.Dir(gowork), nil
}

func loadWorkspace(root string) (*workspace, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", b, nil)
	if err != nil {
		return nil, err
	}
	ws := &workspace{root: root}
	for _, u := range wf.Use {
		dir := filepath.Join(root, u.Path)
		mb, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		p := modfile.ModulePath(mb)
		if !strings.HasPrefix(p, modulePrefix) {
			return nil, fmt.Errorf("%s/go.mod: module %s is not under %s", u.Path, p, modulePrefix)
		}
		rel, _ := filepath.Rel(root, dir)
		ws.modules = append(ws.modules, mod{path: p, dir: dir, rel: rel})
	}
	for _, r := range wf.Replace {
		if ws.version == "" {
			ws.version = r.Old.Version
		} else if r.Old.Version != ws.version {
			return nil, fmt.Errorf("go.work replaces %s at %s, others at %s: run `release version` to set one version", r.Old.Path, r.Old.Version, ws.version)
		}
	}
	if ws.version == "" {
		return nil, errors.New("go.work replaces no module at the release version: run `release version vX.Y.Z`")
	}
	return ws, nil
}

func (ws *workspace) isSibling(path string) bool {
	return slices.ContainsFunc(ws.modules, func(m mod) bool { return m.path == path })
}

func (ws *workspace) readMod(m mod) (*modfile.File, error) {
	name := filepath.Join(m.dir, "go.mod")
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(name, b, nil)
}

// checkConsistent fails on a replace directive in a go.mod, or on a sibling
// required at another version than the release's: what a dependent module
// would see.
func (ws *workspace) checkConsistent() error {
	var errs []error
	for _, m := range ws.modules {
		f, err := ws.readMod(m)
		if err != nil {
			return err
		}
		for _, r := range f.Replace {
			errs = append(errs, fmt.Errorf("%s/go.mod replaces %s: a dependent module ignores it (go.work holds the local replacements)", m.rel, r.Old.Path))
		}
		for _, r := range f.Require {
			if ws.isSibling(r.Mod.Path) && r.Mod.Version != ws.version {
				errs = append(errs, fmt.Errorf("%s/go.mod requires %s@%s, not the release %s", m.rel, r.Mod.Path, r.Mod.Version, ws.version))
			}
		}
	}
	return errors.Join(errs...)
}

// setVersion rewrites every sibling requirement, and go.work's replacements,
// to version.
func (ws *workspace) setVersion(version string) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("%q is not a canonical semantic version (vX.Y.Z)", version)
	}
	for _, m := range ws.modules {
		if err := ws.rewriteMod(m, version); err != nil {
			return err
		}
	}
	if err := ws.writeWork(version); err != nil {
		return err
	}
	fmt.Printf("every module now requires its siblings at %s; tag each module directory (%s/%s, ...)\n", version, ws.modules[1].rel, version)
	return nil
}

func (ws *workspace) rewriteMod(m mod, version string) error {
	f, err := ws.readMod(m)
	if err != nil {
		return err
	}
	for _, r := range f.Require {
		if ws.isSibling(r.Mod.Path) {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
		}
	}
	for _, r := range f.Replace {
		if ws.isSibling(r.Old.Path) {
			if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	f.Cleanup()
	b, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(m.dir, "go.mod"), b, 0o644)
}

// writeWork writes go.work: every module in use, and each replaced at version
// by its directory.
func (ws *workspace) writeWork(version string) error {
	b, err := os.ReadFile(filepath.Join(ws.root, "go.work"))
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork("go.work", b, nil)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "go %s\n\nuse (\n", wf.Go.Version)
	for _, m := range ws.modules {
		fmt.Fprintf(&out, "\t%s\n", dotPath(m.rel))
	}
	out.WriteString(")\n\n")
	out.WriteString("// Each module requires its siblings at the release version, which the module\n")
	out.WriteString("// proxy serves once the release is tagged; until then, and for local\n")
	out.WriteString("// development, these point that version at the checkout (scripts/release).\n")
	out.WriteString("replace (\n")
	for _, m := range ws.modules {
		fmt.Fprintf(&out, "\t%s %s => %s\n", m.path, version, dotPath(m.rel))
	}
	out.WriteString(")\n")
	ws.version = version
	return os.WriteFile(filepath.Join(ws.root, "go.work"), out.Bytes(), 0o644)
}

func dotPath(rel string) string {
	if rel == "." {
		return "."
	}
	return "./" + filepath.ToSlash(rel)
}
