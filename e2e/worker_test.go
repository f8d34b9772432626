package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
)

// callsMetric counts the calls a worker process ran, by tool and outcome;
// pipelineMetric the calls the executors ran through their pipeline (a
// worker's calls among them).
const (
	callsMetric    = "toolwire_worker_tool_calls_total"
	pipelineMetric = "toolwire_executor_tool_calls_total"
)

// buildWorkers builds the example worker, the effect worker of the tests and
// the CLI into one folder.
func buildWorkers(t *testing.T) string {
	t.Helper()
	return buildBinaries(t, "github.com/toolwire/toolwire/examples/worker",
		"github.com/toolwire/toolwire/e2e/testdata/effectworker",
		"github.com/toolwire/toolwire/cmd/toolwire")
}

// startWorkerProc starts bin/prog against NATS at url, with env added, and
// waits until it is ready (its tools registered, its consumers pulling).
func startWorkerProc(t *testing.T, bin, prog, name, url string, env ...string) *proc {
	t.Helper()
	p := launch(t, t, bin, prog, name,
		append([]string{"NATS_URL=" + url, "TOOLWIRE_LOG_LEVEL=info", "TOOLWIRE_WORKER_ID=" + name}, env...)...)
	p.waitReady(t, p.out.String)
	return p
}

// calls returns how many calls of tool the process ran, from its /metrics.
func (p *proc) calls(t *testing.T, tool string) int {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, callsMetric+"{") || !strings.Contains(line, `tool="`+tool+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		n += int(v)
	}
	require.NoError(t, sc.Err())
	return n
}

// upperRuns runs runs runs of calls calls to upper@1.0.0 each, all at once,
// and checks that every call returned its text upper-cased.
func upperRuns(t *testing.T, st *stack.Stack, prefix string, runs, calls int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for r := range runs {
		wg.Go(func() {
			runID := fmt.Sprintf("%s-%d", prefix, r)
			var turn []any
			want := map[string]string{}
			for c := range calls {
				text := fmt.Sprintf("run %d call %d", r, c)
				turn = append(turn, orchestratortest.ToolCall("upper", map[string]any{"text": text}))
				want[text] = strings.ToUpper(text)
			}
			req := orchestratortest.Scripted(t, runID, []string{"upper@1.0.0"},
				envelope.Policy{MaxToolCalls: calls, MaxIterations: 3},
				map[string]any{"tool_calls": turn}, map[string]any{"content": "done"})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			final, err := st.Client.Run(ctx, req, 0)
			if err != nil {
				errs <- fmt.Errorf("run %s: %w", runID, err)
				return
			}
			if len(final.Outputs.ToolOrder) != calls {
				errs <- fmt.Errorf("run %s: %d calls, want %d", runID, len(final.Outputs.ToolOrder), calls)
				return
			}
			for _, env := range final.Outputs.ToolsByID {
				var in, out struct{ Text string }
				if env.Error != nil || json.Unmarshal(env.Input, &in) != nil || json.Unmarshal(env.Output, &out) != nil || out.Text != want[in.Text] {
					errs <- fmt.Errorf("run %s: call %s: error %+v, input %s, output %s", runID, env.CallID, env.Error, env.Input, env.Output)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestWorkerProcessServesItsQueue runs the example worker (examples/worker)
// as its own process beside the pipeline: 90 calls of upper@1.0.0 from runs
// and 10 from `toolwire call` all run in the worker, none in the default
// queue's executors; a second worker process on the same queue then takes a
// share of the next 100 calls; SIGTERM stops both cleanly.
func TestWorkerProcessServesItsQueue(t *testing.T) {
	bin := buildWorkers(t)
	// With identities, as toolwire dev runs: the workers connect with the
	// identity of their queue (toolwire identities --worker text), `toolwire
	// call` as a producer.
	dir := t.TempDir()
	keys, err := identity.LoadOrCreate(stack.IdentitiesDir(dir))
	require.NoError(t, err)
	text := identity.Worker{Queues: []string{"text"}}
	require.NoError(t, keys.AddWorker(text))
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Getenv: func(string) string { return "" }, Identities: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	asWorker := service.EnvNATSSeedFile + "=" + st.Identities.WorkerSeedFile(text)

	const concurrency = "TOOLWIRE_WORKER_CONCURRENCY=8"
	a := startWorkerProc(t, bin, "worker", "worker-a", st.URL, concurrency, asWorker)
	upperRuns(t, st, "one-worker", 9, 10)
	for i := range 10 {
		text := fmt.Sprintf("cli call %d", i)
		cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "toolwire"), "call", "upper@1.0.0",
			"--input", fmt.Sprintf(`{"text":%q}`, text), "--fail-on-error", "--timeout", "60s")
		cmd.Env = append(os.Environ(), "NATS_URL="+st.URL,
			service.EnvNATSSeedFile+"="+st.Identities.SeedFile(identity.Producer),
			service.EnvNATSInbox+"="+identity.Producer.InboxPrefix())
		out, err := cmd.Output()
		require.NoError(t, err, "toolwire call: %s\n%s", out, a.out.String())
		var env envelope.ToolEnvelope
		require.NoError(t, json.Unmarshal(out, &env), "%s", out)
		require.Nil(t, env.Error)
		require.JSONEq(t, fmt.Sprintf(`{"text":%q}`, strings.ToUpper(text)), string(env.Output))
	}
	require.Equal(t, 100, a.calls(t, "upper@1.0.0"), "every call ran in the worker\n%s", a.out.String())
	require.InDelta(t, 100, servicetest.CounterSum(t, st.Metrics, pipelineMetric, map[string]string{"tool": "upper@1.0.0"}), 0,
		"every call went through the executors' pipeline")

	b := startWorkerProc(t, bin, "worker", "worker-b", st.URL, concurrency, asWorker)
	upperRuns(t, st, "two-workers", 10, 10)
	fromA, fromB := a.calls(t, "upper@1.0.0")-100, b.calls(t, "upper@1.0.0")
	require.Equal(t, 100, fromA+fromB, "each call ran once, in one of the workers")
	require.Positive(t, fromA, "worker a took a share")
	require.Positive(t, fromB, "worker b took a share")
	require.InDelta(t, 200, servicetest.CounterSum(t, st.Metrics, pipelineMetric, map[string]string{"tool": "upper@1.0.0"}), 0)
	t.Logf("two workers: a ran %d calls, b ran %d", fromA, fromB)
	a.stop(t)
	b.stop(t)
	for _, w := range []*proc{a, b} {
		require.NotContains(t, w.out.String(), "nats error", "%s hit a permission it lacks", w.name)
	}
}

// TestWorkerKilledMidCallWritesOnce kills a worker process (SIGKILL) while
// its writes tool holds a call after its effect: the executor, which
// watches the heartbeat of the worker that accepted the call, answers
// UNKNOWN once that heartbeat lapses (the outcome of a call whose worker
// died is not known) and never hands the call out again, so the effect
// happens exactly once; the run completes. A later call runs normally, once,
// in the worker started after.
func TestWorkerKilledMidCallWritesOnce(t *testing.T) {
	bin := buildWorkers(t)
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	effects := filepath.Join(t.TempDir(), "effects.txt")
	lines := func() []string {
		b, err := os.ReadFile(effects)
		if os.IsNotExist(err) {
			return nil
		}
		require.NoError(t, err)
		return strings.Fields(string(b))
	}
	// Frequent heartbeats: the executor learns within seconds that the
	// worker holding the call is gone.
	fast := []string{"EFFECT_FILE=" + effects, "TOOLWIRE_WORKER_HEARTBEAT=1s"}

	a := startWorkerProc(t, bin, "effectworker", "effects-a", st.URL, append(fast, "EFFECT_HOLD=1h")...)
	req := orchestratortest.Scripted(t, "killed-mid-call", []string{"record@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("record", map[string]any{"line": "first"})}},
		map[string]any{"content": "done"})
	require.NoError(t, st.Client.Submit(t.Context(), req))
	require.Eventually(t, func() bool { return len(lines()) == 1 }, 60*time.Second, 20*time.Millisecond,
		"the effect never happened\n%s", a.out.String())
	require.NoError(t, a.cmd.Process.Kill(), "killed mid-call, after the effect")
	_ = a.cmd.Wait()

	b := startWorkerProc(t, bin, "effectworker", "effects-b", st.URL, fast...)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	final, err := st.Client.Wait(ctx, req.RunID)
	require.NoError(t, err, b.out.String())
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Len(t, final.Outputs.ToolOrder, 1)
	env := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.NotNil(t, env.Error, "the call was answered, not run again: %s", env.Output)
	require.Equal(t, envelope.CodeUnknown, env.Error.Code)
	details, _ := json.Marshal(env.Error.Details)
	require.Contains(t, string(details), `"outcome":"unknown"`)
	require.Contains(t, string(details), "effects-a", "the envelope names the worker that died holding the call")
	require.Equal(t, []string{"first"}, lines(), "the effect happened exactly once")

	next := orchestratortest.Scripted(t, "after-the-kill", []string{"record@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("record", map[string]any{"line": "second"})}},
		map[string]any{"content": "done"})
	done, err := st.Client.Run(ctx, next, 0)
	require.NoError(t, err)
	got := done.Outputs.ToolsByID[done.Outputs.ToolOrder[0]]
	require.Nil(t, got.Error, "%+v", got.Error)
	require.Equal(t, []string{"first", "second"}, lines())
	b.stop(t)
}
