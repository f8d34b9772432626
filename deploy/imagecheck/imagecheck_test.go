package imagecheck

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/deploy/buildctx"
	"github.com/toolwire/toolwire/deploy/dockerfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A two-module workspace with one binary, and a Dockerfile shaped like ours:
// go.mod files first, then the sources, one go build, images that copy
// the binaries from the builder.
var workspace = map[string]string{
	"go.work":             "go 1.26\n\nuse (\n\t.\n\t./lib\n)\n",
	"go.mod":              "module example.com/app\n\ngo 1.26\n\nrequire example.com/lib v0.0.0\n",
	"cmd/app/main.go":     "package main\n\nimport \"example.com/lib\"\n\nfunc main() { println(lib.Name) }\n",
	"lib/go.mod":          "module example.com/lib\n\ngo 1.26\n",
	"lib/lib.go":          "package lib\n\nconst Name = \"lib\"\n",
	"lib/v2/go.mod":       "module example.com/lib/v2\n\ngo 1.26\n",
	"notes/README.md":     "not needed by the build",
	"cmd/tool/v2/main.go": "package main\n\nfunc main() {}\n",
}

const dockerfileText = `ARG APP=app
FROM golang:1.26 AS builder
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
COPY go.work go.work.sum* ./
COPY go.mod go.sum* ./
COPY lib/go.mod lib/
RUN for d in $(go list -m -f '{{.Dir}}'); do (cd "$d" && go mod download); done
COPY . .
RUN mkdir -p /out && go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/app ./cmd/tool/v2 && ls /out

FROM scratch AS base
COPY --from=builder /out/ /usr/local/bin/

FROM base AS app
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/app"]

FROM scratch AS tool
COPY --from=builder /out/tool /tool
ENTRYPOINT ["/tool"]

FROM ${APP} AS selected
`

func setup(t *testing.T, files map[string]string, dockerignore, dfText string) *Checker {
	t.Helper()
	root := t.TempDir()
	all := map[string]string{".dockerignore": dockerignore, "Dockerfile": dfText}
	for k, v := range files {
		all[k] = v
	}
	for name, body := range all {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	df, err := dockerfile.Parse(strings.NewReader(dfText))
	require.NoError(t, err)
	bc, err := buildctx.Load(root)
	require.NoError(t, err)
	return &Checker{File: df, Context: bc, Scratch: t.TempDir(), Environ: os.Environ()}
}

func TestTargetsBuildFromTheContext(t *testing.T) {
	c := setup(t, workspace, "Dockerfile\n.dockerignore\nnotes/\n", dockerfileText)
	require.NoError(t, c.CopySources())
	targets, err := c.Targets(context.Background())
	require.NoError(t, err)
	require.Len(t, targets, 3, "app, tool and selected have an entrypoint; builder and base do not")

	app := targets["app"]
	require.ElementsMatch(t, []string{"/usr/local/bin/app", "/usr/local/bin/tool"}, keys(app.Binaries),
		"go build -o DIR/ names /vN packages after the element before")
	require.Equal(t, []string{"/usr/local/bin/app"}, app.Entrypoint)
	require.Equal(t, []string{"8080"}, app.Expose)
	for _, p := range app.Binaries {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.NotZero(t, fi.Size())
	}
	require.Equal(t, []string{"/tool"}, keys(targets["tool"].Binaries))
	require.Equal(t, app.Entrypoint, targets["selected"].Entrypoint, "FROM ${APP} resolves to the app stage")

	builds := c.Builds()["builder"]
	require.Len(t, builds, 1)
	require.Contains(t, builds[0], "-trimpath", "the Dockerfile's own flags are used")
}

func TestExcludedCopySourceFails(t *testing.T) {
	c := setup(t, workspace, "lib/\n", dockerfileText)
	err := c.CopySources()
	require.ErrorContains(t, err, "COPY lib/go.mod: excluded by .dockerignore")
	_, err = c.Targets(context.Background())
	require.Error(t, err, "the builder cannot copy lib/go.mod either")
}

func TestMissingCopySourceFails(t *testing.T) {
	df := strings.Replace(dockerfileText, "COPY lib/go.mod lib/", "COPY lib/go.mod lib/\nCOPY VERSION ./", 1)
	c := setup(t, workspace, "", df)
	require.ErrorContains(t, c.CopySources(), "COPY VERSION: no such file in the build context")
}

func TestGlobMatchingExcludedFilesFails(t *testing.T) {
	files := map[string]string{"lib/go.sum": ""}
	for k, v := range workspace {
		files[k] = v
	}
	df := strings.Replace(dockerfileText, "COPY lib/go.mod lib/", "COPY lib/go.mod lib/go.sum* lib/", 1)
	c := setup(t, files, "**/go.sum\n", df)
	require.ErrorContains(t, c.CopySources(), "matches [lib/go.sum], which .dockerignore excludes")
}

func TestExcludedSourcesFailTheBuild(t *testing.T) {
	// The go.mod files are in the context, the library's sources are not:
	// every COPY finds its files, but the go build cannot.
	c := setup(t, workspace, "lib/\n!lib/go.mod\n", dockerfileText)
	require.NoError(t, c.CopySources())
	_, err := c.Targets(context.Background())
	require.ErrorContains(t, err, "RUN go build")
}

func TestModuleNotCopiedBeforeGoCommandFails(t *testing.T) {
	df := strings.Replace(dockerfileText, "COPY lib/go.mod lib/\n", "", 1)
	c := setup(t, workspace, "", df)
	require.NoError(t, c.CopySources())
	_, err := c.Targets(context.Background())
	require.ErrorContains(t, err, "the workspace does not load")
}

func TestEntrypointOutsideTheBuildIsNoBinary(t *testing.T) {
	df := dockerfileText + "\nFROM scratch AS broken\nCOPY --from=builder /out/nothere /x\nENTRYPOINT [\"/x\"]\n"
	c := setup(t, workspace, "", df)
	_, err := c.Targets(context.Background())
	require.ErrorContains(t, err, "stage builder has no such file")
}

func TestOutputsOf(t *testing.T) {
	dir := t.TempDir()
	require.Equal(t, []string{filepath.Join("/o", "a"), filepath.Join("/o", "b")},
		outputsOf([]string{"build", "-ldflags", "-s -w", "-o", "/o/", "./cmd/a", "./x/b/v3"}, dir))
	require.Equal(t, []string{"/bin/x"}, outputsOf([]string{"build", "-o=/bin/x", "./cmd/a"}, dir))
	require.Equal(t, []string{filepath.Join(dir, "a")}, outputsOf([]string{"build", "-tags", "netgo", "./cmd/a"}, dir))
	require.Nil(t, outputsOf([]string{"build", "./a", "./b"}, dir), "go build discards several packages' binaries without -o")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
