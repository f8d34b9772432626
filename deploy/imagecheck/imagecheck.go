// Package imagecheck builds the Go binaries of a Dockerfile's image targets
// the way `docker build` would, from the build context alone and without a
// Docker daemon.
//
// Each stage gets a scratch directory that stands for its filesystem. Its
// instructions are replayed in order: WORKDIR and ENV as written; COPY from
// the build context copies what .dockerignore keeps (a source it excludes is
// an error); COPY --from copies from the other stage's scratch directory;
// every `go build` in a RUN runs in the stage's working directory with the
// stage's ENV, its output paths moved into the scratch directory; any other
// go command in a RUN must at least find its workspace (`go list -m`), which
// catches a go.mod the stage has not copied yet. Other shell commands (apt-get,
// useradd) are not run: what they make is not there, so an entrypoint that
// relies on them is reported.
package imagecheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"

	"github.com/toolwire/toolwire/deploy/buildctx"
	"github.com/toolwire/toolwire/deploy/dockerfile"
)

// Checker replays a Dockerfile over a build context.
type Checker struct {
	File    *dockerfile.File
	Context *buildctx.Context
	// Scratch is an empty directory for the stages' filesystems.
	Scratch string
	// Environ is the environment go commands start from (os.Environ()); the
	// stage's ENV is applied over it, and GOWORK is dropped so that the go
	// command finds the workspace the way it does in the image.
	Environ []string

	stages map[string]*stageFS
}

// stageFS is a stage replayed: its scratch root and what it was left with.
type stageFS struct {
	root    string
	workdir string
	env     map[string]string
	// builds are the go build commands run, for the report.
	builds [][]string
}

// Target is an image target: a stage whose image has an entrypoint.
type Target struct {
	Stage      string
	Entrypoint []string
	Cmd        []string
	Expose     []string
	Env        map[string]string
	// Binaries maps each file the stage holds that a go build made (its path
	// in the image) to that file in the scratch directory.
	Binaries map[string]string
}

// CopySources checks every COPY and ADD that reads the build context: each
// source must be in the context; a glob may match nothing, but none of the
// files it matches in the directory may be left out by .dockerignore.
func (c *Checker) CopySources() error {
	var errs []error
	for _, st := range c.File.Stages {
		for _, in := range st.Instructions {
			if (in.Cmd != "copy" && in.Cmd != "add") || fromStage(in) != "" {
				continue
			}
			srcs, _, err := copyArgs(in)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, src := range srcs {
				if err := c.checkSource(src); err != nil {
					errs = append(errs, fmt.Errorf("Dockerfile line %d (stage %s): %s %s: %w",
						in.Line, stageName(st), strings.ToUpper(in.Cmd), src, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Checker) checkSource(src string) error {
	rel := path.Clean(strings.TrimPrefix(src, "/"))
	if !hasGlob(rel) {
		if c.Context.Has(rel) {
			return nil
		}
		if _, err := os.Lstat(filepath.Join(c.Context.Root, filepath.FromSlash(rel))); err == nil {
			return fmt.Errorf("excluded by %s", buildctx.IgnoreFile)
		}
		return errors.New("no such file in the build context")
	}
	onDisk, err := filepath.Glob(filepath.Join(c.Context.Root, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	var excluded []string
	for _, p := range onDisk {
		r, err := filepath.Rel(c.Context.Root, p)
		if err != nil {
			return err
		}
		if r = filepath.ToSlash(r); !c.Context.Has(r) {
			excluded = append(excluded, r)
		}
	}
	if len(excluded) > 0 {
		return fmt.Errorf("matches %v, which %s excludes", excluded, buildctx.IgnoreFile)
	}
	return nil
}

// Targets replays every image target and returns them by stage name.
func (c *Checker) Targets(ctx context.Context) (map[string]*Target, error) {
	out := map[string]*Target{}
	for _, st := range c.File.Stages {
		img, err := c.File.Image(st)
		if err != nil {
			return nil, err
		}
		if len(img.Entrypoint) == 0 || st.Name == "" {
			continue
		}
		sfs, err := c.replay(ctx, st)
		if err != nil {
			return nil, err
		}
		t := &Target{Stage: st.Name, Entrypoint: img.Entrypoint, Cmd: img.Cmd, Expose: img.Expose,
			Env: img.Env, Binaries: map[string]string{}}
		err = filepath.WalkDir(sfs.root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(sfs.root, p)
			if err != nil {
				return err
			}
			if c.isBuilt(p) {
				t.Binaries["/"+filepath.ToSlash(rel)] = p
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		out[st.Name] = t
	}
	return out, nil
}

// Builds returns the go build command lines that the replay ran, per stage.
func (c *Checker) Builds() map[string][][]string {
	out := map[string][][]string{}
	for name, s := range c.stages {
		if len(s.builds) > 0 {
			out[name] = s.builds
		}
	}
	return out
}

// isBuilt reports whether the file at p is a go build output of some stage
// (stage copies are hard links or copies of those outputs).
func (c *Checker) isBuilt(p string) bool {
	fi, err := os.Stat(p)
	if err != nil {
		return false
	}
	for _, s := range c.stages {
		for _, b := range s.builds {
			if slices.ContainsFunc(outputsOf(b, s.path(s.workdir)), func(o string) bool {
				ofi, err := os.Stat(o)
				return err == nil && os.SameFile(fi, ofi)
			}) {
				return true
			}
		}
	}
	return false
}

// replay runs the instructions of st and of the stages it is built on.
func (c *Checker) replay(ctx context.Context, st *dockerfile.Stage) (*stageFS, error) {
	key := stageName(st)
	if s, ok := c.stages[key]; ok {
		if s == nil {
			return nil, fmt.Errorf("stage %s copies from itself", key)
		}
		return s, nil
	}
	if c.stages == nil {
		c.stages = map[string]*stageFS{}
	}
	c.stages[key] = nil // in progress
	s := &stageFS{root: filepath.Join(c.Scratch, "stages", key), workdir: "/", env: map[string]string{}}
	if base, ok := c.File.Stage(st.Base); ok {
		parent, err := c.replay(ctx, base)
		if err != nil {
			return nil, err
		}
		if err := linkTree(parent.root, s.root); err != nil {
			return nil, err
		}
		s.workdir = parent.workdir
		for k, v := range parent.env {
			s.env[k] = v
		}
	}
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		return nil, err
	}
	for _, in := range st.Instructions {
		var err error
		switch in.Cmd {
		case "workdir":
			dir := dockerfile.Expand(in.Raw, s.env)
			if !path.IsAbs(dir) {
				dir = path.Join(s.workdir, dir)
			}
			s.workdir = dir
			err = os.MkdirAll(s.path(dir), 0o755)
		case "env":
			var kv map[string]string
			if kv, err = dockerfile.EnvPairs(in, s.env); err == nil {
				for k, v := range kv {
					s.env[k] = v
				}
			}
		case "copy", "add":
			err = c.copy(ctx, s, in)
		case "run":
			err = c.run(ctx, s, in)
		}
		if err != nil {
			return nil, fmt.Errorf("Dockerfile line %d (stage %s): %w", in.Line, key, err)
		}
	}
	c.stages[key] = s
	return s, nil
}

// path maps an absolute path in the image to the scratch directory.
func (s *stageFS) path(p string) string {
	return filepath.Join(s.root, filepath.FromSlash(path.Clean("/"+p)))
}

func (s *stageFS) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(s.workdir, p)
}

func (c *Checker) copy(ctx context.Context, s *stageFS, in dockerfile.Instruction) error {
	srcs, dest, err := copyArgs(in)
	if err != nil {
		return err
	}
	dest = dockerfile.Expand(dest, s.env)
	// Docker copies into a directory when the destination says so (a trailing
	// slash, "."), or when several files may arrive.
	intoDir := strings.HasSuffix(dest, "/") || dest == "." || len(srcs) > 1 || slices.ContainsFunc(srcs, hasGlob)
	dest = s.abs(dest)
	if from := fromStage(in); from != "" {
		other, ok := c.File.Stage(from)
		if !ok {
			return fmt.Errorf("COPY --from=%s: not a stage of this Dockerfile (images are not replayed)", from)
		}
		ofs, err := c.replay(ctx, other)
		if err != nil {
			return err
		}
		for _, src := range srcs {
			matches, err := filepath.Glob(ofs.path(src))
			if err != nil {
				return err
			}
			if len(matches) == 0 {
				return fmt.Errorf("COPY --from=%s %s: stage %s has no such file (was it built?)", from, src, from)
			}
			for _, m := range matches {
				if err := placeTree(m, s.path(dest), intoDir || isDir(m)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, src := range srcs {
		matches, err := c.Context.Glob(src)
		if err != nil {
			return err
		}
		if len(matches) == 0 && !hasGlob(src) {
			return fmt.Errorf("%s %s: not in the build context", strings.ToUpper(in.Cmd), src)
		}
		for _, m := range matches {
			if c.Context.IsDir(m) {
				for _, f := range c.Context.Under(m) {
					rel := strings.TrimPrefix(f, m+"/")
					if m == "." {
						rel = f
					}
					if err := c.Context.CopyFile(f, filepath.Join(s.path(dest), filepath.FromSlash(rel))); err != nil {
						return err
					}
				}
				continue
			}
			target := s.path(dest)
			if intoDir || isDir(target) {
				target = filepath.Join(target, path.Base(m))
			}
			if err := c.Context.CopyFile(m, target); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Checker) run(ctx context.Context, s *stageFS, in dockerfile.Instruction) error {
	cmds, err := RunCommands(in)
	if err != nil {
		return err
	}
	for _, cmd := range cmds {
		if cmd.Args[0] != "go" {
			continue
		}
		if len(cmd.Args) < 2 || cmd.Args[1] != "build" {
			// go mod download, go list -m ...: the workspace must load here.
			if err := c.goCmd(ctx, s, []string{"list", "-m"}); err != nil {
				return fmt.Errorf("RUN %s: the workspace does not load: %w", strings.Join(cmd.Args, " "), err)
			}
			continue
		}
		if !cmd.Literal {
			return fmt.Errorf("RUN %s: an argument of go build is not a literal word", strings.Join(cmd.Args, " "))
		}
		args, err := s.redirectOutputs(cmd.Args[1:])
		if err != nil {
			return err
		}
		s.builds = append(s.builds, args)
		if err := c.goCmd(ctx, s, args); err != nil {
			return fmt.Errorf("RUN go %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}

// Command is one simple command of a RUN's shell script.
type Command struct {
	// Args are its words, unquoted; a word with an expansion ($x, $(cmd))
	// is kept as written.
	Args []string
	// Literal is true when no word has an expansion.
	Literal bool
}

// RunCommands returns the simple commands of a RUN instruction, in the order
// they are written (loops and conditions included, whether or not they run).
func RunCommands(in dockerfile.Instruction) ([]Command, error) {
	script := strings.Join(in.Args, " ")
	if in.JSON {
		script = shellQuote(in.Args)
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangPOSIX)).Parse(strings.NewReader(script), "RUN")
	if err != nil {
		return nil, fmt.Errorf("Dockerfile line %d: RUN: %w", in.Line, err)
	}
	var out []Command
	syntax.Walk(f, func(n syntax.Node) bool {
		call, ok := n.(*syntax.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		cmd := Command{Literal: true}
		for _, w := range call.Args {
			lit, ok := literal(w)
			if !ok {
				lit, cmd.Literal = wordText(w), false
			}
			cmd.Args = append(cmd.Args, lit)
		}
		out = append(out, cmd)
		return true
	})
	return out, nil
}

// redirectOutputs moves go build's -o into the scratch directory.
func (s *stageFS) redirectOutputs(args []string) ([]string, error) {
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		a := out[i]
		switch {
		case a == "-o" && i+1 < len(out):
			out[i+1] = s.outPath(out[i+1])
			i++
		case strings.HasPrefix(a, "-o="):
			out[i] = "-o=" + s.outPath(strings.TrimPrefix(a, "-o="))
		}
	}
	for _, o := range outputsOf(out, s.path(s.workdir)) {
		if err := os.MkdirAll(filepath.Dir(o), 0o755); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *stageFS) outPath(p string) string {
	trail := strings.HasSuffix(p, "/")
	q := s.path(s.abs(p))
	if trail {
		q += string(filepath.Separator)
	}
	return q
}

func (c *Checker) goCmd(ctx context.Context, s *stageFS, args []string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = s.path(s.workdir)
	// The image's environment is its ENV, not the caller's: drop the go
	// settings a developer's shell may carry.
	env := slices.DeleteFunc(slices.Clone(c.Environ), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, set := s.env[k]
		return set || hostOnly[k]
	})
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w\n%s", err, out.String())
	}
	return nil
}

// hostOnly are the go environment variables that the caller's environment
// must not pass into a replayed stage.
var hostOnly = map[string]bool{"GOWORK": true, "GOFLAGS": true, "CGO_ENABLED": true, "GOOS": true,
	"GOARCH": true, "GOEXPERIMENT": true}

// outputsOf returns the files a go build command line run in dir writes:
// with -o DIR/ (or several packages) one per main package, named after its
// last import path element (or the one before a /vN suffix), as the go
// command names them; without -o, one package's binary in dir, and nothing
// for several packages (go build discards them).
func outputsOf(args []string, dir string) []string {
	var o string
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "build":
		case a == "-o" && i+1 < len(args):
			o = args[i+1]
			i++
		case strings.HasPrefix(a, "-o="):
			o = strings.TrimPrefix(a, "-o=")
		case strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && valueFlag[strings.TrimLeft(a, "-")]:
			i++
		case strings.HasPrefix(a, "-"):
		default:
			pkgs = append(pkgs, a)
		}
	}
	if o == "" {
		if len(pkgs) > 1 {
			return nil
		}
		o = dir + string(filepath.Separator)
	}
	if len(pkgs) == 1 && !strings.HasSuffix(o, string(filepath.Separator)) && !isDir(o) {
		return []string{o}
	}
	var out []string
	for _, p := range pkgs {
		out = append(out, filepath.Join(o, binaryName(p)))
	}
	return out
}

// valueFlag are the go build flags whose value is the next argument.
var valueFlag = map[string]bool{
	"o": true, "p": true, "C": true, "asmflags": true, "buildmode": true,
	"compiler": true, "gccgoflags": true, "gcflags": true, "installsuffix": true, "ldflags": true,
	"mod": true, "modfile": true, "overlay": true, "pgo": true, "pkgdir": true, "tags": true,
	"toolexec": true, "covermode": true, "coverpkg": true,
}

func binaryName(pkg string) string {
	parts := strings.Split(strings.TrimSuffix(pkg, "/"), "/")
	name := parts[len(parts)-1]
	if len(parts) > 1 && len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
		name = parts[len(parts)-2]
	}
	return name
}

func copyArgs(in dockerfile.Instruction) (srcs []string, dest string, err error) {
	if len(in.Args) < 2 {
		return nil, "", fmt.Errorf("Dockerfile line %d: %s wants a source and a destination", in.Line, strings.ToUpper(in.Cmd))
	}
	return in.Args[:len(in.Args)-1], in.Args[len(in.Args)-1], nil
}

func fromStage(in dockerfile.Instruction) string {
	v, _ := in.Flag("from")
	return v
}

func stageName(st *dockerfile.Stage) string {
	if st.Name != "" {
		return st.Name
	}
	return fmt.Sprintf("line%d", st.Line)
}

func hasGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// literal returns a shell word's value when it has no expansion.
func literal(w *syntax.Word) (string, bool) {
	var b strings.Builder
	for _, part := range w.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			b.WriteString(p.Value)
		case *syntax.SglQuoted:
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				lit, ok := q.(*syntax.Lit)
				if !ok {
					return "", false
				}
				b.WriteString(lit.Value)
			}
		default:
			return "", false
		}
	}
	return b.String(), true
}

func wordText(w *syntax.Word) string {
	var b bytes.Buffer
	_ = syntax.NewPrinter().Print(&b, w)
	return b.String()
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// linkTree makes dst a copy of src, hard-linking files where it can.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		return linkFile(p, target)
	})
}

// placeTree copies src (a file or a directory's contents) to dst; into says
// dst is a directory that receives src under its base name, for a file.
func placeTree(src, dst string, into bool) error {
	if isDir(src) {
		return linkTree(src, dst)
	}
	if into {
		dst = filepath.Join(dst, filepath.Base(src))
	}
	return linkFile(src, dst)
}

func linkFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, fi.Mode().Perm())
}
