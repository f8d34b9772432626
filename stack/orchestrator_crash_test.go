package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	scriptedmodel "github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// countingModel is the scripted model, counting its calls per run,
// iteration and replica.
type countingModel struct {
	mu    sync.Mutex
	calls map[string][]modelCall // by "run/iteration"
}

type modelCall struct {
	replica string
	at      time.Time
}

// forReplica is the model as one replica calls it.
func (m *countingModel) forReplica(name string) provider.Provider {
	return provider.Func(func(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
		k := fmt.Sprintf("%s/%d", req.RunID, req.Iteration)
		m.mu.Lock()
		m.calls[k] = append(m.calls[k], modelCall{replica: name, at: time.Now()})
		m.mu.Unlock()
		return scriptedmodel.Provider{}.Complete(ctx, req)
	})
}

func (m *countingModel) of(run string, it int) []modelCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]modelCall(nil), m.calls[fmt.Sprintf("%s/%d", run, it)]...)
}

// explainModelCalls accounts for every model call of one turn: exactly one
// answer was recorded (the call that started at the recorded turn's t_start),
// one more call for each answer a crash right after the model threw away, and
// any other call was made by a replica that died, its answer with it. It
// returns how many calls a death explains.
func explainModelCalls(t *testing.T, key string, calls []modelCall, recordedStart time.Time,
	lost []modelCall, killedAt map[string]time.Time) int {
	t.Helper()
	rec := -1
	for i, c := range calls {
		d := c.at.Round(0).Sub(recordedStart)
		if d >= 0 && d < 100*time.Millisecond && (rec < 0 || d < calls[rec].at.Round(0).Sub(recordedStart)) {
			rec = i
		}
	}
	require.GreaterOrEqual(t, rec, 0, "%s: the recorded turn is one of the model's answers", key)
	rest := append(append([]modelCall(nil), calls[:rec]...), calls[rec+1:]...)
	// Each answer lost by a crash: the latest call of that replica before it.
	for _, l := range lost {
		best := -1
		for i, c := range rest {
			if c.replica == l.replica && !c.at.After(l.at) && (best < 0 || c.at.After(rest[best].at)) {
				best = i
			}
		}
		require.GreaterOrEqual(t, best, 0, "%s: a crash after the model's answer follows a model call", key)
		rest = append(rest[:best], rest[best+1:]...)
	}
	// The rest died with their replica: it was killed while it waited for
	// the answer (or, as the test kills a replica by closing its connection,
	// its last handlers still called the model after the close, and could
	// record nothing).
	for _, c := range rest {
		_, died := killedAt[c.replica]
		require.True(t, died, "%s: a model call by %s at %s is explained by no lost answer", key, c.replica, c.at)
	}
	return len(rest)
}

// A fault plan fails every (run, point, iteration) of the runs it covers
// exactly once, the first time a replica reaches it: most as a crash of the
// handler (an error or a panic: the event is redelivered at once), some as
// the death of the whole replica (its connection closes while the handler is
// stopped at the point; another replica gets the event when its ack wait
// runs out, and a new replica takes the dead one's place).
type faultPlan struct {
	mu       sync.Mutex
	covers   func(run string) bool
	killAt   map[string]orchestrator.FaultPoint // run -> point where its first hit kills the replica
	failed   map[faultKey]string                // how each key failed: "error", "panic" or "kill"
	lost     map[faultKey][]modelCall           // the after_model failures: whose answer was lost, when
	byPoint  map[orchestrator.FaultPoint]int
	replicas map[string]int // fault points reached per replica
	kills    chan *faultyReplica
}

type faultKey struct {
	run   string
	point orchestrator.FaultPoint
	it    int
}

var errInjected = errors.New("injected crash")

// faultyReplica is the Faults of one replica.
type faultyReplica struct {
	plan *faultPlan
	name string
	dead chan struct{}
	r    *orchestratortest.Replica
}

func (f *faultyReplica) Fault(ctx context.Context, p orchestrator.FaultPoint, run string, it int) error {
	pl := f.plan
	pl.mu.Lock()
	pl.replicas[f.name]++
	k := faultKey{run, p, it}
	if !pl.covers(run) || pl.failed[k] != "" {
		pl.mu.Unlock()
		return nil
	}
	how := "error"
	switch {
	case pl.killAt[run] == p:
		how = "kill"
		delete(pl.killAt, run)
	case (len(pl.failed))%2 == 1:
		how = "panic"
	}
	pl.failed[k] = how
	pl.byPoint[p]++
	if p == orchestrator.FaultAfterModel {
		pl.lost[k] = append(pl.lost[k], modelCall{replica: f.name, at: time.Now()})
	}
	pl.mu.Unlock()
	switch how {
	case "kill":
		pl.kills <- f
		select {
		case <-f.dead:
		case <-ctx.Done():
		}
		return fmt.Errorf("%w: replica %s killed at %s", errInjected, f.name, p)
	case "panic":
		panic(fmt.Sprintf("injected crash at %s of run %s iteration %d", p, run, it))
	}
	return fmt.Errorf("%w at %s of run %s iteration %d", errInjected, p, run, it)
}

func (pl *faultPlan) lostAnswers(run string, it int) []modelCall {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.lost[faultKey{run, orchestrator.FaultAfterModel, it}]
}

var runToken = regexp.MustCompile(`^toolwire\.(run|call)\.[^.]+\.`)

// shape is a run's events as a multiset of subjects with the run id blanked:
// the call ids (in call subjects), the iterations, the turns, the usage
// numbers and the lifecycle, each with how often it was stored.
func shape(evs []orchestratortest.Stored) map[string]int {
	out := map[string]int{}
	for _, e := range evs {
		out[runToken.ReplaceAllString(e.Subject, "toolwire.$1.RUN.")]++
	}
	return out
}

// TestCrashAtEveryPoint kills the orchestrator at every point of every turn
// of many concurrent runs, served by two replicas that share the work (and
// are replaced when one dies), and checks that every run ends exactly as an
// undisturbed run of the same request: the same outputs, the same call ids,
// every event stored once (no duplicate call, turn or lifecycle event), and
// the model called again only when its answer was lost.
func TestCrashAtEveryPoint(t *testing.T) {
	const runs = 25
	h := newPipeline(t)
	model := &countingModel{calls: map[string][]modelCall{}}
	plan := &faultPlan{
		covers:   func(run string) bool { return strings.HasPrefix(run, "crash-") },
		killAt:   map[string]orchestrator.FaultPoint{},
		failed:   map[faultKey]string{},
		lost:     map[faultKey][]modelCall{},
		byPoint:  map[orchestrator.FaultPoint]int{},
		replicas: map[string]int{},
		kills:    make(chan *faultyReplica, 64),
	}
	points := orchestrator.FaultPoints()
	for i := 0; i < runs; i += 5 {
		plan.killAt[fmt.Sprintf("crash-%02d", i)] = points[(i/5)%len(points)]
	}
	started := 0
	start := func() *faultyReplica {
		started++
		f := &faultyReplica{plan: plan, name: fmt.Sprintf("orchestrator-%d", started), dead: make(chan struct{})}
		f.r = h.Start(f.name, orchestrator.Config{
			Providers:    orchestrator.Providers{scriptedmodel.Name: model.forReplica(f.name)},
			ModelTimeout: 500 * time.Millisecond, AckWait: 2 * time.Second, Faults: f,
			// Every run publishes its started event (at once), so that the
			// shape of a run that crashes and one that does not are the same.
			StartedAfter: -1,
		})
		return f
	}
	start()
	start()

	request := func(id string) envelope.RunRequest {
		return orchestratortest.Scripted(t, id, []string{"echo@1.0.0", "calculator@1.0.0", "sleep@1.0.0"}, envelope.Policy{},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("echo", map[string]any{"text": "a"}),
				orchestratortest.ToolCall("calculator", map[string]any{"expression": "6*7"}),
				orchestratortest.ToolCall("sleep", map[string]any{"ms": 100}),
			}},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("echo", map[string]any{"text": "b"}),
				orchestratortest.ToolCall("calculator", map[string]any{"expression": 7}), // VALIDATION_ERROR
			}},
			map[string]any{"content": "done"},
		)
	}

	// The undisturbed run.
	ref := h.Run(request("reference"), time.Minute)
	require.Equal(t, events.StatusCompleted, ref.Status, ref.Reason)
	refOut := orchestratortest.Normalize(t, ref.Outputs)
	require.Len(t, refOut.ToolOrder, 5)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	type result struct {
		id  string
		st  *events.RunStatus
		err error
	}
	results := make(chan result, runs)
	for i := range runs {
		id := fmt.Sprintf("crash-%02d", i)
		h.Submit(ctx, request(id))
		go func() {
			st, err := h.Wait(ctx, id)
			results <- result{id, st, err}
		}()
	}
	final := map[string]*events.RunStatus{}
	killed := map[*faultyReplica]bool{}
	killedAt := map[string]time.Time{}
	for len(final) < runs {
		select {
		case f := <-plan.kills:
			if killed[f] {
				continue
			}
			killed[f] = true
			killedAt[f.name] = time.Now()
			f.r.Conn.Close() // dead: nothing it still does reaches NATS
			close(f.dead)
			f.r.Kill()
			start() // and a new replica takes its place
		case r := <-results:
			require.NoError(t, r.err, r.id)
			final[r.id] = r.st
		case <-ctx.Done():
			t.Fatalf("runs did not finish: %d of %d done", len(final), runs)
		}
	}

	all := h.StreamEvents(t.Context())
	refShape := shape(all["reference"])
	byDeath := 0
	for id, st := range final {
		require.Equal(t, events.StatusCompleted, st.Status, "%s: %s", id, st.Reason)
		require.Equal(t, refOut, orchestratortest.Normalize(t, st.Outputs), "%s: outputs and call ids as undisturbed", id)
		require.Equal(t, refShape, shape(all[id]), "%s: every event once, the same as undisturbed", id)
		// The model is called again only when its answer was lost.
		for _, e := range orchestratortest.OfType(all[id], events.TypeTurnCompleted) {
			var tr events.Turn
			require.NoError(t, json.Unmarshal(e.Data, &tr))
			it := tr.Iteration
			byDeath += explainModelCalls(t, fmt.Sprintf("%s iteration %d", id, it), model.of(id, it), tr.TStart,
				plan.lostAnswers(id, it), killedAt)
		}
	}
	for s, n := range refShape {
		require.Equal(t, 1, n, "the reference stores %s once", s)
	}
	require.Len(t, model.of("reference", 1), 1)

	plan.mu.Lock()
	defer plan.mu.Unlock()
	var kinds []string
	hows := map[string]int{}
	for _, how := range plan.failed {
		hows[how]++
	}
	for p, n := range plan.byPoint {
		kinds = append(kinds, fmt.Sprintf("%s=%d", p, n))
	}
	sort.Strings(kinds)
	t.Logf("injected %d failures (%v) at %v; %d replicas started, %d killed; fault points reached per replica: %v; "+
		"%d model calls were lost with a dying replica", len(plan.failed), hows, kinds, started, len(killed), plan.replicas, byDeath)
	// Every point of every turn fails once in every run: before_model,
	// after_model and after_publish_turn (3 turns), after_record_envelope
	// (2 turns with calls), before_publish_outputs (1). A point is passed by
	// only when a replica died just after the state change before it (its
	// write stored, its acknowledgement lost with the connection).
	for p, want := range map[orchestrator.FaultPoint]int{
		orchestrator.FaultBeforeModel: 3 * runs, orchestrator.FaultAfterModel: 3 * runs, orchestrator.FaultAfterPublishTurn: 3 * runs,
		orchestrator.FaultAfterRecordEnvelope: 2 * runs, orchestrator.FaultBeforePublishOutputs: runs,
	} {
		require.GreaterOrEqual(t, plan.byPoint[p], want-hows["kill"], "failures at %s", p)
	}
	require.Equal(t, len(points), hows["kill"], "one replica death at each point")
	require.NotEmpty(t, killed)
	served := 0
	for _, n := range plan.replicas {
		if n > 0 {
			served++
		}
	}
	require.GreaterOrEqual(t, served, 3, "the replicas share the work")
}
