package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// readmeSection is the README section whose two Go blocks are a tool
// program and its workertest test.
const readmeSection = "## Your own tool in 20 lines"

// producerProgram is a producer of twenty lines: it submits a run and waits
// for its end with the client, as an upstream Go system does.
const producerProgram = `package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
)

func main() {
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	req := envelope.RunRequest{RunID: "hello-1", Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "me"},
		Agent:    envelope.Agent{Name: "hello", Model: envelope.Model{Provider: "openai", Name: "gpt-4o-mini"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Hello"}}}
	st, err := client.New(js, "/producer").Run(context.Background(), req, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Status)
}
`

// forbidden are modules neither a worker's nor a producer's module graph may
// name: the recorder's databases and browser, the deploy checks' kustomize
// and moby.
var forbidden = []string{
	"github.com/chromedp/", "github.com/jackc/pgx", "modernc.org/sqlite", "github.com/mattn/go-sqlite3",
	"sigs.k8s.io/kustomize", "github.com/moby/",
}

// natsServer may be in a graph as a test-only requirement (the worker's and
// the client's own tests, workertest), never linked into a binary.
const natsServer = "github.com/nats-io/nats-server/v2"

// check packs every module at a test version into a file-based proxy, then,
// in fresh modules outside the checkout with no go.work, requires the
// worker and the client as a dependent would, builds the README's tool
// program, runs its workertest test, and builds a producer; it fails when a
// graph names a forbidden module or a binary links nats-server.
func (ws *workspace) check(ctx context.Context, keep bool) (err error) {
	if err := ws.checkConsistent(); err != nil {
		return err
	}
	program, test, err := ws.readmeTool()
	if err != nil {
		return err
	}
	version := fmt.Sprintf("%s-check.%d", ws.version, time.Now().Unix())
	tmp, err := os.MkdirTemp("", "toolwire-release-check-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("==> keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	defer func() { err = errors.Join(err, purgeModCache(ctx)) }()
	proxy := filepath.Join(tmp, "proxy")
	fmt.Printf("==> packing %d modules at %s into %s\n", len(ws.modules), version, proxy)
	if err := ws.pack(proxy, version); err != nil {
		return err
	}
	env := dependentEnv(proxy)

	var report []string
	r0, err := dependent(ctx, env, filepath.Join(tmp, "program"), "example.com/upper",
		map[string]string{"main.go": program}, []string{modulePrefix + "/worker@" + version}, false)
	if err != nil {
		return fmt.Errorf("the README's tool program: %w", err)
	}
	report = append(report, "worker (README tool program alone): "+r0)
	toolDir := filepath.Join(tmp, "tool")
	files := map[string]string{"main.go": program, "main_test.go": test}
	r, err := dependent(ctx, env, toolDir, "example.com/upper", files, []string{
		modulePrefix + "/worker@" + version, modulePrefix + "/client@" + version,
	}, true)
	if err != nil {
		return fmt.Errorf("the README's tool: %w", err)
	}
	report = append(report, "worker (README tool program + workertest test): "+r)
	r, err = dependent(ctx, env, filepath.Join(tmp, "producer"), "example.com/producer",
		map[string]string{"main.go": producerProgram}, []string{modulePrefix + "/client@" + version}, false)
	if err != nil {
		return fmt.Errorf("the producer: %w", err)
	}
	report = append(report, "producer (client): "+r)
	fmt.Println("==> release check passed")
	for _, l := range report {
		fmt.Println("    " + l)
	}
	return nil
}

// dependent makes a module of its own in dir with files, requires mods,
// tidies, builds and (when test) tests it, and checks its graph and binary.
func dependent(ctx context.Context, env []string, dir, path string, files map[string]string, mods []string, test bool) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			return "", err
		}
	}
	steps := [][]string{{"mod", "init", path}, append([]string{"get"}, mods...), {"mod", "tidy"}, {"build", "-o", "bin", "."}}
	if test {
		steps = append(steps, []string{"test", "-count=1", "./..."})
	}
	for _, s := range steps {
		fmt.Printf("==> %s: go %s\n", filepath.Base(dir), strings.Join(s, " "))
		if err := goCmd(ctx, dir, env, s...); err != nil {
			return "", err
		}
	}
	graph, err := goOutput(ctx, dir, env, "mod", "graph")
	if err != nil {
		return "", err
	}
	paths := moduleGraphPaths(graph)
	var bad []string
	for p := range paths {
		for _, f := range forbidden {
			if strings.HasPrefix(p, f) {
				bad = append(bad, p)
			}
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		return "", fmt.Errorf("go mod graph names %s", strings.Join(bad, ", "))
	}
	linked, err := goOutput(ctx, dir, env, "version", "-m", filepath.Join(dir, "bin"))
	if err != nil {
		return "", err
	}
	deps := 0
	for l := range strings.Lines(linked) {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[0] == "dep" || f[0] == "=>") {
			deps++
			if f[1] == natsServer {
				return "", fmt.Errorf("the binary links %s", natsServer)
			}
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "bin"))
	if err != nil {
		return "", err
	}
	lines := strings.Count(graph, "\n")
	return fmt.Sprintf("go mod graph %d lines, %d modules, nats-server in graph: %v (test-only); binary %.1f MB linking %d modules, no nats-server",
		lines, len(paths), paths[natsServer], float64(fi.Size())/1e6, deps), nil
}

// readmeTool returns the two Go blocks of the README's section: the tool
// program and its test.
func (ws *workspace) readmeTool() (program, test string, err error) {
	b, err := os.ReadFile(filepath.Join(ws.root, "README.md"))
	if err != nil {
		return "", "", err
	}
	s := string(b)
	i := strings.Index(s, "\n"+readmeSection+"\n")
	if i < 0 {
		return "", "", fmt.Errorf("README.md has no section %q", readmeSection)
	}
	s = s[i+1:]
	if j := strings.Index(s[len(readmeSection):], "\n## "); j >= 0 {
		s = s[:len(readmeSection)+j]
	}
	var blocks []string
	for {
		start := strings.Index(s, "```go\n")
		if start < 0 {
			break
		}
		s = s[start+len("```go\n"):]
		end := strings.Index(s, "```\n")
		if end < 0 {
			return "", "", errors.New("README.md: an unclosed ```go block")
		}
		blocks = append(blocks, s[:end])
		s = s[end:]
	}
	if len(blocks) != 2 {
		return "", "", fmt.Errorf("README.md's %q has %d Go blocks, want 2 (the program and its test)", readmeSection, len(blocks))
	}
	return blocks[0], blocks[1], nil
}
