package dockerfile

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const sample = `# syntax=docker/dockerfile:1
# escape=\
# A comment before the first instruction.
ARG SERVICE=api
ARG GO_VERSION="1.26"

FROM golang:${GO_VERSION}-bookworm AS Builder
WORKDIR /src
ENV CGO_ENABLED=0 \
    GOFLAGS="-buildvcs=false -trimpath"
COPY go.mod go.sum* ./
RUN --mount=type=cache,target=/root/.cache \
    # a comment inside a continuation is dropped
    go build -o /out/ ./cmd/api

FROM scratch AS base
COPY --from=builder /out/ /usr/local/bin/
WORKDIR home
USER 65532:65532

FROM base AS api
EXPOSE 8080 4222/tcp
ENTRYPOINT ["/usr/local/bin/api"]
CMD ["serve", "--http", "0.0.0.0:8080"]

FROM base AS shell
ENTRYPOINT /usr/local/bin/api serve

FROM ${SERVICE} AS selected
`

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader(sample))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"SERVICE": "api", "GO_VERSION": "1.26"}, f.Args)
	var names []string
	for _, s := range f.Stages {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"builder", "base", "api", "shell", "selected"}, names, "AS names are lower-cased")

	b, ok := f.Stage("BUILDER")
	require.True(t, ok, "stage names are case-insensitive")
	require.Equal(t, "golang:1.26-bookworm", b.Base, "FROM expands the global ARGs")
	require.Len(t, b.Instructions, 4)
	run := b.Instructions[3]
	require.Equal(t, "run", run.Cmd)
	require.Equal(t, []string{"--mount=type=cache,target=/root/.cache"}, run.Flags)
	require.Equal(t, []string{"go build -o /out/ ./cmd/api"}, []string{strings.Join(strings.Fields(run.Args[0]), " ")},
		"continuations are joined and the comment inside them is dropped")
	require.Equal(t, 12, run.Line)

	copyIn := f.Stages[1].Instructions[0]
	from, ok := copyIn.Flag("from")
	require.True(t, ok)
	require.Equal(t, "builder", from)
	require.Equal(t, []string{"/out/", "/usr/local/bin/"}, copyIn.Args)

	sel, _ := f.Stage("selected")
	require.Equal(t, "api", sel.Base)
}

func TestImage(t *testing.T) {
	f, err := Parse(strings.NewReader(sample))
	require.NoError(t, err)

	api, _ := f.Stage("api")
	img, err := f.Image(api)
	require.NoError(t, err)
	require.Equal(t, []string{"/usr/local/bin/api"}, img.Entrypoint)
	require.Equal(t, []string{"serve", "--http", "0.0.0.0:8080"}, img.Cmd)
	require.Equal(t, []string{"8080", "4222/tcp"}, img.Expose)
	require.Equal(t, "/home", img.Workdir, "a relative WORKDIR joins the one before")
	require.Equal(t, "65532:65532", img.User)
	require.Empty(t, img.Env, "the builder's ENV is not in images built FROM other stages")

	shell, _ := f.Stage("shell")
	img, err = f.Image(shell)
	require.NoError(t, err)
	require.Equal(t, []string{"/bin/sh", "-c", "/usr/local/bin/api serve"}, img.Entrypoint)

	sel, _ := f.Stage("selected")
	img, err = f.Image(sel)
	require.NoError(t, err)
	require.Equal(t, []string{"serve", "--http", "0.0.0.0:8080"}, img.Cmd, "a stage inherits its base stage's image")

	b, _ := f.Stage("builder")
	img, err = f.Image(b)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -trimpath"}, img.Env)
}

// imageOf parses text and returns the image of its stage named stage.
func imageOf(t *testing.T, text, stage string) Image {
	t.Helper()
	f, err := Parse(strings.NewReader(text))
	require.NoError(t, err)
	st, ok := f.Stage(stage)
	require.True(t, ok, stage)
	img, err := f.Image(st)
	require.NoError(t, err)
	return img
}

func TestEntrypointResetsInheritedCmd(t *testing.T) {
	img := imageOf(t, "FROM scratch AS a\nCMD [\"x\"]\nFROM a AS b\nENTRYPOINT [\"/bin/b\"]\n", "b")
	require.Equal(t, []string{"/bin/b"}, img.Entrypoint)
	require.Nil(t, img.Cmd, "Docker drops the base's CMD when a stage sets ENTRYPOINT")
}

func TestLegacyEnv(t *testing.T) {
	img := imageOf(t, "FROM scratch AS a\nENV HOME /home/x y\nENV B=$HOME/b\n", "a")
	require.Equal(t, map[string]string{"HOME": "/home/x y", "B": "/home/x y/b"}, img.Env,
		"a variable's spaces do not split the value it lands in")
}

func TestParseRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"no FROM":                   "# nothing\n",
		"RUN before FROM":           "RUN true\nFROM scratch\n",
		"heredoc":                   "FROM scratch\nRUN <<EOF\ntrue\nEOF\n",
		"unterminated continuation": "FROM scratch\nRUN true \\\n",
		"FROM with junk":            "FROM a b c d\n",
		"bad escape directive":      "# escape=x\nFROM scratch\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(text))
			require.Error(t, err)
		})
	}
}

func TestBacktickEscape(t *testing.T) {
	f, err := Parse(strings.NewReader("# escape=`\nFROM scratch AS a\nRUN echo a `\n  b\n"))
	require.NoError(t, err)
	a, _ := f.Stage("a")
	require.Equal(t, "echo a b", strings.Join(strings.Fields(a.Instructions[0].Args[0]), " "))
}
