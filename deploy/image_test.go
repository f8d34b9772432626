package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/toolwire/toolwire/deploy/buildctx"
	"github.com/toolwire/toolwire/deploy/dockerfile"
	"github.com/toolwire/toolwire/deploy/imagecheck"
)

// repoRoot is the repository's root: this module is its deploy/ folder.
const repoRoot = ".."

func checker(t *testing.T) *imagecheck.Checker {
	t.Helper()
	df, err := dockerfile.ParseFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	bc, err := buildctx.Load(repoRoot)
	require.NoError(t, err)
	return &imagecheck.Checker{File: df, Context: bc, Scratch: t.TempDir(), Environ: os.Environ()}
}

// TestDockerfileCopiesOnlyWhatTheContextHolds: no COPY names a file that
// .dockerignore leaves out (or that does not exist).
func TestDockerfileCopiesOnlyWhatTheContextHolds(t *testing.T) {
	require.NoError(t, checker(t).CopySources())
}

// TestImageTargetsBuildFromTheContext replays the Dockerfile over the files
// .dockerignore keeps, running its own go build commands, and checks that
// every image target holds the binary it starts, and that every binary of
// the repository (cmd/toolwire, services/<name>/cmd/<name>) is some image's
// entrypoint.
func TestImageTargetsBuildFromTheContext(t *testing.T) {
	c := checker(t)
	targets, err := c.Targets(context.Background())
	require.NoError(t, err)
	for name, tg := range c.Builds() {
		t.Logf("stage %s ran: go %s", name, tg)
	}

	entrypoints := map[string]string{} // binary name -> target
	for name, tg := range targets {
		require.NotEmpty(t, tg.Binaries, "target %s holds no binary built by the Dockerfile", name)
		bin := tg.Entrypoint[0]
		require.Contains(t, tg.Binaries, bin, "target %s starts %s, which its go build did not make (it has %v)",
			name, bin, keys(tg.Binaries))
		entrypoints[filepath.Base(bin)] = name
	}

	mains, err := filepath.Glob(filepath.Join(repoRoot, "services", "*", "cmd", "*", "main.go"))
	require.NoError(t, err)
	mains = append(mains, filepath.Join(repoRoot, "cmd", "toolwire", "main.go"))
	require.Greater(t, len(mains), 1)
	for _, m := range mains {
		bin := filepath.Base(filepath.Dir(m))
		require.Contains(t, entrypoints, bin, "no Dockerfile target runs %s (%s)", bin, m)
	}

	// docker-compose builds its services from these targets.
	for _, file := range composeFiles(t) {
		for name, svc := range readCompose(t, file).Services {
			if svc.Build.Target == "" {
				continue
			}
			_, ok := targets[svc.Build.Target]
			require.True(t, ok, "%s: service %s builds target %q, which is no image target of the Dockerfile", file, name, svc.Build.Target)
		}
	}
}

// TestImagesListenWhereTheyExpose: each service image's TOOLWIRE_HTTP_ADDR
// and the CLI image's `dev` listeners are on every interface and on a port
// the image EXPOSEs; the flags the CLI image passes are flags of `toolwire dev`.
func TestImagesListenWhereTheyExpose(t *testing.T) {
	c := checker(t)
	targets, err := c.Targets(context.Background())
	require.NoError(t, err)
	for name, tg := range targets {
		if addr, ok := tg.Env["TOOLWIRE_HTTP_ADDR"]; ok {
			requireReachable(t, name+" TOOLWIRE_HTTP_ADDR", addr, tg.Expose)
		}
	}

	cli, ok := targets["toolwire"]
	require.True(t, ok, "the Dockerfile has a toolwire (CLI) target")
	require.Equal(t, "dev", cli.Cmd[0], "the CLI image runs toolwire dev")
	for _, flag := range []string{"--http", "--nats-listen"} {
		v, ok := flagValue(cli.Cmd, flag)
		require.True(t, ok, "the CLI image sets %s: dev's default listens on 127.0.0.1, unreachable from outside a container", flag)
		requireReachable(t, "toolwire "+flag, v, cli.Expose)
	}
	// The binary the image holds accepts that command line (cobra refuses an
	// unknown flag before it prints the help).
	bin := cli.Binaries[cli.Entrypoint[0]]
	out, err := exec.Command(bin, append(slices.Clone(cli.Cmd), "--help")...).CombinedOutput()
	require.NoError(t, err, "toolwire %s --help:\n%s", strings.Join(cli.Cmd, " "), out)
	require.Contains(t, string(out), "--nats-listen")
}

// TestSandboxImageCarriesItsRuntimes: the sandbox image installs the job
// runtimes and the interpreter from Debian's packages.
func TestSandboxImageCarriesItsRuntimes(t *testing.T) {
	df, err := dockerfile.ParseFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	st, ok := df.Stage("sandbox")
	require.True(t, ok)
	chain, err := df.Chain(st)
	require.NoError(t, err)
	var installed []string
	for _, s := range chain {
		for _, in := range s.Instructions {
			if in.Cmd != "run" {
				continue
			}
			cmds, err := imagecheck.RunCommands(in)
			require.NoError(t, err)
			for _, cmd := range cmds {
				if cmd.Args[0] == "apt-get" && slices.Contains(cmd.Args, "install") {
					for _, a := range cmd.Args[slices.Index(cmd.Args, "install")+1:] {
						if !strings.HasPrefix(a, "-") {
							installed = append(installed, a)
						}
					}
				}
			}
		}
	}
	for _, pkg := range []string{"bubblewrap", "runsc", "python3"} {
		require.Contains(t, installed, pkg, "the sandbox image installs %s (it has %v)", pkg, installed)
	}
	img, err := df.Image(st)
	require.NoError(t, err)
	require.Equal(t, "65532:65532", img.User, "the sandbox runs as the non-root uid the manifests expect")
}

// requireReachable: addr listens on every interface, on a port in expose.
func requireReachable(t *testing.T, what, addr string, expose []string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%s %q", what, addr)
	require.Contains(t, []string{"", "0.0.0.0", "::"}, host, "%s %q: a container is reached on its own interfaces, not on loopback", what, addr)
	var ports []string
	for _, e := range expose {
		p, _, _ := strings.Cut(e, "/")
		ports = append(ports, p)
	}
	require.Contains(t, ports, port, "%s %q: the image EXPOSEs %v", what, addr, expose)
}

// flagValue finds --name value or --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// compose is the part of a docker-compose file the tests read.
type compose struct {
	Services map[string]composeService `json:"services"`
}

type composeService struct {
	Image       string         `json:"image"`
	Command     []string       `json:"command"`
	Environment map[string]any `json:"environment"`
	Profiles    []string       `json:"profiles"`
	Build       struct {
		Target string `json:"target"`
	} `json:"build"`
	DependsOn map[string]any  `json:"depends_on"`
	Volumes   []composeVolume `json:"volumes"`
	Ports     []string        `json:"ports"`
}

// composeVolume is a service's mount, from the short syntax
// ("source:target[:ro]") or the long one (a mapping, decoded strictly, so
// that a misspelt key such as sub_path fails instead of mounting the whole
// volume).
type composeVolume struct {
	Type     string `json:"type"` // volume or bind
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only"`
	Volume   struct {
		Subpath string `json:"subpath"`
		NoCopy  bool   `json:"nocopy"`
	} `json:"volume"`
}

func (v *composeVolume) UnmarshalJSON(b []byte) error {
	var short string
	if err := json.Unmarshal(b, &short); err == nil {
		parts := strings.Split(short, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("volume %q: want source:target[:mode]", short)
		}
		*v = composeVolume{Type: "volume", Source: parts[0], Target: parts[1]}
		if strings.HasPrefix(v.Source, ".") || strings.HasPrefix(v.Source, "/") {
			v.Type = "bind"
		}
		v.ReadOnly = len(parts) == 3 && slices.Contains(strings.Split(parts[2], ","), "ro")
		return nil
	}
	type long composeVolume
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var l long
	if err := dec.Decode(&l); err != nil {
		return fmt.Errorf("volume %s: %w", b, err)
	}
	*v = composeVolume(l)
	return nil
}

func composeFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "docker-compose*.yml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

func readCompose(t *testing.T, file string) compose {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var c compose
	require.NoError(t, yaml.Unmarshal(b, &c), file)
	return c
}
