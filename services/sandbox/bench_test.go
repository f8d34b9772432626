package sandbox

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
)

// coldStartSource is the program of the cold-start benchmark: read the input,
// print an output. Every job starts a fresh sandbox and a fresh python3.
const coldStartSource = "import json, sys\nprint(json.dumps({'n': json.load(sys.stdin)['n'] + 1}))"

// BenchmarkColdStart measures one job from start to result, in one run, for:
//
//	python3       bare python3 started by os/exec: no isolation, no supervision
//	insecure-dev  the sandbox's supervision (gate, rlimits, cgroup, job uid,
//	              cleanup sweep) around python3, without isolation
//	bwrap         bubblewrap: namespaces, seccomp, tmpfs, plus the supervision
//	gvisor        gVisor runsc: a new Sentry per job, plus the supervision
//
// Run it with: go test -run '^$' -bench ColdStart -benchtime 30x ./services/sandbox
func BenchmarkColdStart(b *testing.B) {
	e := newTestEngine(b, Config{InsecureDev: true, Concurrency: 1})
	input := []byte(`{"n":41}`)
	want := []byte(`{"n": 42}`)

	b.Run("python3", func(b *testing.B) {
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, e.cfg.Python, "-I", "-B", "-c", coldStartSource)
			cmd.Stdin = bytes.NewReader(input)
			out, err := cmd.Output()
			cancel()
			if err != nil || !bytes.Equal(bytes.TrimSpace(out), want) {
				b.Fatalf("python3: %v %q", err, out)
			}
		}
	})
	runtimes := []struct {
		name string
		rt   runtime
	}{
		{RuntimeInsecureDev, e.insecure},
		{RuntimeBwrap, e.runtimes[RuntimeBwrap]},
		{RuntimeGVisor, e.runtimes[RuntimeGVisor]},
	}
	for _, r := range runtimes {
		b.Run(r.name, func(b *testing.B) {
			job := &events.SandboxJob{Source: coldStartSource, Input: input, Stdout: events.SandboxStdoutJSON}
			for b.Loop() {
				o, pr, err := e.execute(context.Background(), r.rt, job, e.cfg.Limits, 30*time.Second)
				if err != nil || o.err != nil || !bytes.Equal(o.output, want) {
					b.Fatalf("%s: %v %+v %q (stderr %q)", r.name, err, o.err, o.output, pr.Stderr)
				}
			}
		})
	}
}
