package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
)

// startProc starts the binary of service name with env and waits until it
// is ready; owner's end kills it.
func startProc(t, owner *testing.T, bin, name string, env []string) *proc {
	t.Helper()
	p := launch(t, owner, bin, name, name, append(env, "TOOLWIRE_LOG_LEVEL="+logLevel())...)
	p.waitReady(t, p.out.String)
	return p
}

// TestKill9DuringABurst kills each service with SIGKILL during a burst of
// runs and starts it again: every run of the burst finishes within twice the
// ack wait of the killed service's consumers (what a killed process holds
// its pulled messages for), and the recorder, killed, stores every run
// within twice its own. The orchestrator's and the executor's ack waits are
// set to 10s here (TOOLWIRE_ORCHESTRATOR_ACK_WAIT, TOOLWIRE_EXECUTOR_ACK_WAIT);
// the policy's is the default 30s, the recorder's its default 5s
// (TOOLWIRE_RECORDER_ACK_WAIT). The sandbox is not killed: the demo's runs
// do not use it. Over the whole burst, no run ends twice and nothing of a
// run is stored after its end.
func TestKill9DuringABurst(t *testing.T) {
	bin := buildServices(t)

	nats := eventstest.Start(t)
	env := []string{"NATS_URL=" + nats.URL, "DATABASE_URL=" + pgtest.Schema(t),
		"TOOLWIRE_ORCHESTRATOR_ACK_WAIT=10s", "TOOLWIRE_EXECUTOR_ACK_WAIT=10s"}
	var mu sync.Mutex
	procs := map[string]*proc{}
	for _, s := range services {
		procs[s] = startProc(t, t, bin, s, env)
	}
	c := client.New(nats.JS, "/test")

	parent := t
	for _, tc := range []struct {
		service string
		ackWait time.Duration
	}{
		{"orchestrator", 10 * time.Second},
		{"executor", 10 * time.Second},
		{"policy", 30 * time.Second},
		{"recorder", 5 * time.Second},
	} {
		t.Run(tc.service, func(t *testing.T) {
			const n = 30
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			var ids []string
			for i := range n {
				ids = append(ids, fmt.Sprintf("kill-%s-%02d", tc.service, i))
			}
			// The burst goes on while the service is killed (SIGKILL) a
			// few runs in, and a new process is started at once.
			submitted := make(chan error, 1)
			go func() {
				for i, id := range ids {
					if err := c.Submit(ctx, demo.Request(id)); err != nil {
						submitted <- err
						return
					}
					if i < 5 {
						time.Sleep(10 * time.Millisecond)
					}
				}
				submitted <- nil
			}()
			time.Sleep(40 * time.Millisecond)
			mu.Lock()
			procs[tc.service].kill()
			killedAt := time.Now()
			procs[tc.service] = startProc(t, parent, bin, tc.service, env)
			mu.Unlock()
			require.NoError(t, <-submitted)

			bound := 2 * tc.ackWait
			wctx, wcancel := context.WithDeadline(ctx, killedAt.Add(bound))
			defer wcancel()
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i, id := range ids {
				wg.Go(func() {
					st, err := c.Follow(wctx, id, nil)
					if err == nil && st.Status != events.StatusCompleted {
						err = fmt.Errorf("%s ended %s: %s", id, st.Status, st.Reason)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					fctx, fcancel := context.WithTimeout(t.Context(), 2*time.Second)
					_, _ = c.Follow(fctx, ids[i], func(e client.Event) bool {
						t.Logf("%s: %s", ids[i], e.Event.Type())
						return true
					})
					fcancel()
					for _, cn := range []struct{ stream, name string }{{events.StreamRuns, "orchestrator-runs"}, {events.StreamCalls, "orchestrator-calls"}} {
						if cons, err := nats.JS.Consumer(t.Context(), cn.stream, cn.name); err == nil {
							if info, err := cons.Info(t.Context()); err == nil {
								t.Logf("%s: pending %d, ack pending %d, waiting %d, redelivered %d, delivered %+v ackfloor %+v",
									cn.name, info.NumPending, info.NumAckPending, info.NumWaiting, info.NumRedelivered, info.Delivered, info.AckFloor)
							}
						}
					}
				}
				require.NoError(t, err, "run %s did not finish within %s of the kill\n%s", ids[i], bound, dumpProcs(procs))
			}
			t.Logf("every run finished %s after the kill (bound %s)", time.Since(killedAt).Round(time.Millisecond), bound)

			if tc.service == "recorder" {
				rec := procs["recorder"]
				for _, id := range ids {
					require.Eventually(t, func() bool { return rec.answers("/v1/runs/" + id + "/outputs") }, max(time.Until(killedAt.Add(bound)), time.Second), 100*time.Millisecond, "the recorder never stored %s", id)
				}
			}
		})
	}
	broken, err := eventstest.AfterEnd(t.Context(), nats.JS)
	require.NoError(t, err)
	require.Empty(t, broken, "nothing of a run follows its end")
}

func dumpProcs(procs map[string]*proc) string {
	var b strings.Builder
	for name, p := range procs {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", name, p.out.String())
	}
	return b.String()
}

// logLevel is the services' log level: TOOLWIRE_TEST_LOG_LEVEL, else warn.
func logLevel() string {
	if l := os.Getenv("TOOLWIRE_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}
