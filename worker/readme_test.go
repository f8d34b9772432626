package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/printer"
	"go/token"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
)

// readmeSection is the README section whose Go blocks this test runs.
const readmeSection = "## Your own tool in 20 lines"

// goBlocks returns the ```go blocks of the README section that starts with
// heading, in order.
func goBlocks(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	readme := string(b)
	i := strings.Index(readme, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "README.md has no section %q", heading)
	section := readme[i+1:]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	var blocks []string
	for {
		start := strings.Index(section, "```go\n")
		if start < 0 {
			return blocks
		}
		section = section[start+len("```go\n"):]
		end := strings.Index(section, "```\n")
		require.GreaterOrEqual(t, end, 0, "an unclosed ```go block")
		blocks = append(blocks, section[:end])
		section = section[end:]
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// withoutComments prints Go source without its comments and blank lines.
func withoutComments(t *testing.T, src string) string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", src, parser.SkipObjectResolution)
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, printer.Fprint(&b, fset, f))
	var lines []string
	for l := range strings.Lines(b.String()) {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "")
}

// TestREADMEWorkerExample copies the README's worker program and its test
// out of README.md into a module of their own, with a bare go.mod (no
// replace lines) in a workspace with this checkout, as the README says, runs
// the test (the test kit at work), then builds the program and runs it
// as its own process against an embedded pipeline: a run's call of
// upper@1.0.0 is served by it, and SIGTERM stops it cleanly.
func TestREADMEWorkerExample(t *testing.T) {
	blocks := goBlocks(t, readmeSection)
	require.Len(t, blocks, 2, "the section has the program and its test")
	dir := t.TempDir()
	write := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	write("main.go", blocks[0])
	require.Equal(t, withoutComments(t, blocks[0]), withoutComments(t, readFile(t, filepath.Join("..", "examples", "worker", "main.go"))),
		"examples/worker/main.go is the README's program, with comments")
	write("main_test.go", blocks[1])
	write("go.mod", "module example.com/upper\n\ngo 1.26.8\n")

	// The workspace: the new module and every module of this checkout.
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	list := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}")
	list.Dir = repo
	mods, err := list.Output()
	require.NoError(t, err)
	var work strings.Builder
	work.WriteString("go 1.26.8\n\nuse (\n\t.\n")
	for _, m := range strings.Fields(string(mods)) {
		work.WriteString("\t" + m + "\n")
	}
	work.WriteString(")\n")
	// The checkout's replacements, which point the siblings' release
	// version at the checkout until that version is published.
	edit := exec.CommandContext(t.Context(), "go", "work", "edit", "-json")
	edit.Dir = repo
	js, err := edit.Output()
	require.NoError(t, err)
	var ws struct {
		Replace []struct {
			Old, New struct{ Path, Version string }
		}
	}
	require.NoError(t, json.Unmarshal(js, &ws))
	for _, r := range ws.Replace {
		to := r.New.Path
		if r.New.Version == "" && !filepath.IsAbs(to) {
			to = filepath.Join(repo, to)
		}
		fmt.Fprintf(&work, "replace %s %s => %s %s\n", r.Old.Path, r.Old.Version, to, r.New.Version)
	}
	write("go.work", work.String())
	if sum, err := os.ReadFile(filepath.Join(repo, "go.work.sum")); err == nil {
		write("go.work.sum", string(sum))
	}
	goCmd := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-buildvcs=false")
		return cmd
	}

	out, err := goCmd("test", "-count=1", ".").CombinedOutput()
	require.NoError(t, err, "the README's test of the program: %s", out)

	out, err = goCmd("build", "-o", filepath.Join(dir, "upper"), ".").CombinedOutput()
	require.NoError(t, err, "go build of the README's program: %s", out)
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	logs := &servicetest.Output{}
	prog := exec.Command(filepath.Join(dir, "upper"))
	prog.Env = append(os.Environ(), "NATS_URL="+st.URL, "TOOLWIRE_HTTP_ADDR="+addr)
	prog.Stdout, prog.Stderr = logs, logs
	require.NoError(t, prog.Start())
	t.Cleanup(func() {
		if prog.ProcessState == nil {
			_ = prog.Process.Kill()
			_ = prog.Wait()
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond, "the README's program never became ready\n%s", logs.String())

	req := orchestratortest.Scripted(t, "readme-worker", []string{"upper@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("upper", map[string]any{"text": "hello"})}},
		map[string]any{"content": "done"})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	final, err := st.Client.Run(ctx, req, 0)
	require.NoError(t, err, logs.String())
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Len(t, final.Outputs.ToolOrder, 1)
	got := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.Nil(t, got.Error, "%+v", got.Error)
	var text struct{ Text string }
	require.NoError(t, json.Unmarshal(got.Output, &text))
	require.Equal(t, "HELLO", text.Text)

	require.NoError(t, prog.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- prog.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "the program did not exit cleanly\n%s", logs.String())
	case <-time.After(40 * time.Second):
		t.Fatalf("the program did not stop after SIGTERM\n%s", logs.String())
	}
}
