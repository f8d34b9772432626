package orchestrator

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

func TestToolResultContent(t *testing.T) {
	ok := &envelope.ToolEnvelope{Output: json.RawMessage(`{"x":1}`)}
	require.Equal(t, `{"x":1}`, ToolResultContent(ok))
	require.Equal(t, "null", ToolResultContent(&envelope.ToolEnvelope{}))

	rl := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeRateLimit, Message: "slow down", RetryAfterS: 2}}
	require.JSONEq(t, `{"error":{"code":"RATE_LIMIT","message":"slow down","retry_after_s":2}}`, ToolResultContent(rl))

	val := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeValidation, Message: "bad", Details: []string{"at /x: missing"}}}
	require.JSONEq(t, `{"error":{"code":"VALIDATION_ERROR","message":"bad","details":["at /x: missing"]}}`, ToolResultContent(val))

	// The texts the adapters' tests (provider/openai, provider/anthropic)
	// send as tool results are these, byte for byte.
	require.Equal(t, `{"error":{"code":"RATE_LIMIT","message":"slow down","retry_after_s":2}}`, ToolResultContent(rl))
	require.Equal(t, `{"error":{"code":"VALIDATION_ERROR","details":["at /expression: got number, want string"],"message":"input does not match the schema"}}`,
		ToolResultContent(&envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeValidation,
			Message: "input does not match the schema", Details: []string{"at /expression: got number, want string"}}}))

	// Internals of an UNKNOWN error never reach the model.
	unk := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeUnknown, Message: "internal error in tool x", Details: "stack trace"}}
	require.NotContains(t, ToolResultContent(unk), "stack trace")
}

// newTestService is a service enough for the turn-building code: its
// configuration and rules, no NATS.
func newTestService(cfg Config) *Service {
	s := &Service{cfg: cfg.WithDefaults(), rules: rules.NewGuard(), convs: newConversations()}
	return s
}

func TestTurnCallsNumberIdAndQueue(t *testing.T) {
	s := newTestService(Config{})
	versions := map[string]string{"echo": "1.0.0", "calculator": "2.1.0"}
	defs := map[string]*envelope.ToolDefinition{
		"echo":       {Name: "echo", Version: "1.0.0", Cost: 0.25, Queue: "text"},
		"calculator": {Name: "calculator", Version: "2.1.0"},
	}
	calls := []envelope.ToolCall{
		{ID: "a", Name: "echo", Arguments: validArguments(json.RawMessage(`{"text": "x", "n": 1.0}`))},
		{ID: "b", Name: "calculator", Arguments: validArguments(json.RawMessage(`{not json`))},
		{ID: "c", Name: "unknown_tool", Arguments: validArguments(nil)},
		{ID: "d", Name: "web.search", Arguments: validArguments(json.RawMessage(`{}`))},
	}
	var got []events.TurnCall
	for i, tc := range calls {
		got = append(got, s.turnCall(tc, 4+i, versions, defs))
	}
	want, err := envelope.CallID("echo", "1.0.0", []byte(`{"n":1,"text":"x"}`), 4)
	require.NoError(t, err)
	require.Equal(t, want, got[0].CallID, "the id is over the canonical input and the seq")
	require.Equal(t, 0.25, got[0].Cost)
	require.Equal(t, "text", got[0].Queue, "the tool's queue")
	require.Equal(t, "2.1.0", got[1].Version)
	require.Equal(t, envelope.DefaultQueue, got[1].Queue)
	require.JSONEq(t, `"{not json"`, string(got[1].Input), "broken JSON reaches the tool as a string")
	require.Equal(t, "", got[2].Version, "a tool the agent has not enabled gets no version: the guard refuses it")
	require.False(t, got[2].Answered)
	require.JSONEq(t, `{}`, string(got[2].Input))
	require.True(t, got[3].Answered, "no tool can be called web.search")
	require.Equal(t, "web_search", got[3].Name, "made safe for the receipt")
	require.Equal(t, "", got[3].Version, "but never matched to the enabled tool")
	for i, c := range got {
		require.Equal(t, 4+i, c.Seq)
	}
	same := s.turnCall(calls[0], 9, versions, defs)
	require.NotEqual(t, got[0].CallID, same.CallID, "same input, other seq: other id")

	turn := &events.Turn{TEnd: time.Unix(1, 0).UTC(), Response: &envelope.ModelResponse{ToolCalls: calls}}
	env := answer(turn, &got[3])
	require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
	require.Contains(t, env.Error.Message, `"web.search"`, "the name the model wrote")
	require.Equal(t, got[3].CallID, env.CallID)
}

// Valid JSON that cannot be canonicalized (a number out of range, a lone
// surrogate) is answered at once with VALIDATION_ERROR: no tool can take it,
// and no retry can change that.
func TestTurnCallsAnswerArgumentsNoToolCanTake(t *testing.T) {
	s := newTestService(Config{})
	versions := map[string]string{"echo": "1.0.0"}
	for _, args := range []string{`{"n": 1e400}`, `{"text": "\ud800"}`, `{"text": "\udc00x"}`, "{\"t\": \"\xff\"}", `[-1e999]`} {
		c := s.turnCall(envelope.ToolCall{ID: "a", Name: "echo", Arguments: validArguments(json.RawMessage(args))}, 1, versions, nil)
		require.True(t, c.Answered, args)
		require.Len(t, c.CallID, 64, args)
		env := answer(&events.Turn{}, &c)
		require.Equal(t, envelope.CodeValidation, env.Error.Code, args)
		require.Contains(t, env.Error.Message, "no tool can take", args)
		require.Equal(t, args, string(env.Input), "the input as the model sent it")
		again := s.turnCall(envelope.ToolCall{ID: "a", Name: "echo", Arguments: validArguments(json.RawMessage(args))}, 1, versions, nil)
		require.Equal(t, c.CallID, again.CallID, "the same call, the same id")
	}
}

func TestRecordTurnAndSettle(t *testing.T) {
	s := newTestService(Config{})
	st := &RunState{RunID: "r1", Iteration: 1, Phase: PhaseCalling, Calls: 0}
	t1 := &events.Turn{RunID: "r1", Iteration: 1, Verdict: events.LoopVerdict{Allowed: true}, Cost: 0.5,
		Response: &envelope.ModelResponse{Usage: envelope.Usage{InputTokens: 100, OutputTokens: 20}},
		Calls:    []events.TurnCall{{CallID: "a", Seq: 1, Name: "echo"}, {CallID: "b", Seq: 2, Name: "x_y", Answered: true}}}
	require.True(t, st.recordTurn(t1))
	require.Equal(t, PhaseAwaitingTools, st.Phase)
	require.Equal(t, 2, st.Calls)
	require.InDelta(t, 0.5, st.Spend, 1e-12)
	require.Equal(t, 120, st.LastTokens)
	require.False(t, st.Pending[0].Done)
	require.True(t, st.Pending[1].Done, "the orchestrator's own answer")
	require.False(t, st.recordTurn(t1), "a turn is recorded once")

	// Its last result moves the run on to the next model call, driven by
	// that result's handler.
	s.advance(st, "call/x")
	require.Equal(t, PhaseAwaitingTools, st.Phase, "not before every call is answered")
	st.Pending[0].Done = true
	s.advance(st, "call/a")
	require.Equal(t, PhaseCalling, st.Phase)
	require.Equal(t, 2, st.Iteration)
	require.Equal(t, "call/a", st.Trigger)

	// A turn without calls ends the loop.
	t2 := &events.Turn{RunID: "r1", Iteration: 2, Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{Content: "bye"}}
	require.True(t, st.recordTurn(t2))
	require.Equal(t, PhaseComplete, st.Phase)
	require.True(t, st.Done())

	// A turn whose calls the orchestrator answered all is ready to go on.
	st = &RunState{RunID: "r2", Iteration: 1, Phase: PhaseCalling}
	t3 := &events.Turn{RunID: "r2", Iteration: 1, Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{},
		Calls: []events.TurnCall{{CallID: "c", Seq: 1, Name: "bad", Answered: true}}}
	st.recordTurn(t3)
	require.True(t, st.allDone())
	s.advance(st, triggerRequest)
	require.Equal(t, PhaseCalling, st.Phase)
	require.Equal(t, 2, st.Iteration)
}

// The loop rules run where the loop runs: past max_iterations, or with the
// budget spent, the next model call is denied and the run ends with the
// denial, which a denied turn records.
func TestAdvanceRunsTheLoopRules(t *testing.T) {
	s := newTestService(Config{Prices: Prices{"m": {InputPerMTok: 1e6}}})
	st := &RunState{RunID: "r1", Iteration: 2, Phase: PhaseAwaitingTools, Policy: envelope.Policy{MaxIterations: 2},
		Pending: []PendingCall{{CallID: "a", Done: true}}, UpdatedAt: time.Unix(5, 0).UTC()}
	s.advance(st, "call/a")
	require.Equal(t, PhaseFailed, st.Phase)
	require.Equal(t, 3, st.Iteration)
	require.Equal(t, envelope.CodePolicyDenied, st.Code)
	require.Equal(t, "policy denied iteration 3: max_iterations (2) reached: iteration 3 not allowed", st.Reason)
	require.Equal(t, rules.RuleMaxIterations, st.Denied.Rule)
	d := deniedTurn(st)
	require.False(t, d.Verdict.Allowed)
	require.Nil(t, d.Response)
	require.Equal(t, 3, d.Iteration)

	st = &RunState{RunID: "r2", Iteration: 1, Phase: PhaseAwaitingTools, Model: events.ModelRef{Provider: "openai", Name: "m"},
		Policy: envelope.Policy{MaxBudget: 1}, Spend: 0.5, LastTokens: 1, Pending: []PendingCall{{CallID: "a", Done: true}}}
	s.advance(st, "call/a")
	require.Equal(t, PhaseFailed, st.Phase, "0.5 spent and the next call costs at least 1")
	require.Equal(t, rules.RuleMaxBudget, st.Denied.Rule)
}

// A Start that fails part way releases what it had set up (the registry
// watch, the approval watch, the consumers already started: each holds a
// subscription of the service's connection, and their goroutines are
// checked by TestMain), and leaves the service stopped.
func TestFailedStartReleasesWhatItSetUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(ctx context.Context, js jetstream.JetStream) error
		err     string
	}{
		{name: "approvals bucket missing", err: "open approvals",
			breakIt: func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteKeyValue(ctx, events.BucketApprovals)
			}},
		{name: "calls stream missing", err: "stream " + events.StreamCalls,
			breakIt: func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteStream(ctx, events.StreamCalls)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := eventstest.Start(t)
			ctx := t.Context()
			require.NoError(t, tc.breakIt(ctx, env.JS))
			nc := env.Connect(t)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			// A first request sets up the connection's response subscription,
			// which stays; everything after it must go.
			_, err = js.AccountInfo(ctx)
			require.NoError(t, err)
			subs := nc.NumSubscriptions()

			svc, err := New(service.Deps{Conn: nc, JS: js}, Config{})
			require.NoError(t, err)
			require.ErrorContains(t, svc.Start(ctx), tc.err)
			require.Equal(t, subs, nc.NumSubscriptions(), "every watch and consumer is gone")
			require.False(t, svc.Running())
			require.ErrorIs(t, svc.Start(ctx), service.ErrStopped)
			require.NoError(t, svc.Stop(ctx))
		})
	}
}

// Start is refused once started and after Stop; Stop is idempotent.
func TestStartStop(t *testing.T) {
	env := eventstest.Start(t)
	svc, err := New(service.Deps{Conn: env.Conn, JS: env.JS}, Config{})
	require.NoError(t, err)
	require.NoError(t, svc.Stop(t.Context()), "a Stop before Start")
	svc, err = New(service.Deps{Conn: env.Conn, JS: env.JS}, Config{})
	require.NoError(t, err)
	require.NoError(t, svc.Start(t.Context()))
	require.True(t, svc.Running())
	require.ErrorIs(t, svc.Start(t.Context()), service.ErrAlreadyStarted)
	require.NoError(t, svc.Stop(t.Context()))
	require.NoError(t, svc.Stop(t.Context()))
	require.ErrorIs(t, svc.Start(t.Context()), service.ErrStopped)
	<-svc.Done()
}

// Build reads the environment, then applies the options: what the binary and
// `toolwire dev` run.
func TestBuild(t *testing.T) {
	env := eventstest.Start(t)
	mine := provider.Func(func(context.Context, provider.Request) (envelope.ModelResponse, error) {
		return envelope.ModelResponse{Content: "mine"}, nil
	})
	d := service.Deps{Conn: env.Conn, JS: env.JS, Getenv: func(k string) string {
		return map[string]string{EnvConcurrency: "8", EnvOpenAIKey: "sk-example"}[k]
	}}
	svc, err := Build(d, WithProviders(Providers{"mine": mine}),
		func(c *Config) { c.ModelTimeout = time.Second })
	require.NoError(t, err)
	cfg := svc.Config()
	require.Equal(t, 8, cfg.Concurrency)
	require.Equal(t, time.Second, cfg.ModelTimeout)
	require.Equal(t, "sk-example", cfg.OpenAI.APIKey)
	require.Equal(t, []string{"mine", "openai", "scripted"}, cfg.Providers.Names())

	d.Getenv = func(k string) string { return map[string]string{EnvConcurrency: "0"}[k] }
	_, err = Build(d)
	require.EqualError(t, err, `orchestrator configuration: TOOLWIRE_ORCHESTRATOR_CONCURRENCY="0": want a whole number from 1 to 4096`)
}

// gatedKV holds every Update while closed, so that a test can make changes
// queue up behind a write in flight and be applied as one group.
type gatedKV struct {
	jetstream.KeyValue
	closed  atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if g.closed.Load() {
		g.entered <- struct{}{}
		<-g.open
	}
	return g.KeyValue.Update(ctx, key, value, rev)
}

// The envelope of a call whose turn is not yet recorded in the run's state
// is applied even when the recording of that turn lands in the same group
// of writes, after the envelope's change found no such call: the change is
// made again once the turn is in, and the call is done. (Deciding by the
// state written, which has the call, dropped the envelope and left the run
// waiting for ever: found by the bench's three-turn scenario.)
func TestEnvelopeOfALaggingTurnGroupedWithItsRecording(t *testing.T) {
	env := eventstest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	g := &gatedKV{KeyValue: kv, entered: make(chan struct{}, 1), open: make(chan struct{})}
	s := &Service{states: newStateStore(g), history: &history{js: env.JS}}
	s.Log = slog.New(slog.DiscardHandler)
	s.history.runs, err = env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	s.history.calls, err = env.JS.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)

	const run = "lagging-1"
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	_, err = s.states.create(ctx, &RunState{V: stateVersion, RunID: run, Iteration: 2, Phase: PhaseCalling,
		Trigger: triggerCall(id('a')), Pending: []PendingCall{{CallID: id('a'), Seq: 1, Name: "echo", Version: "1.0.0", Done: true}}})
	require.NoError(t, err)
	turn2 := events.Turn{RunID: run, Iteration: 2, Tenant: envelope.Tenant{OrgID: "acme"}, Agent: "a",
		Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{},
		Calls: []events.TurnCall{
			{CallID: id('b'), Seq: 2, Name: "echo", Version: "1.0.0", Input: []byte(`{}`), Queue: envelope.DefaultQueue},
			{CallID: id('c'), Seq: 3, Name: "echo", Version: "1.0.0", Input: []byte(`{}`), Queue: envelope.DefaultQueue},
		}}
	o, err := events.NewTurnCompleted("/test", turn2, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, o)

	queued := func(n int) {
		require.Eventually(t, func() bool {
			s.states.mu.Lock()
			sl := s.states.runs[run]
			s.states.mu.Unlock()
			if sl == nil {
				return false
			}
			sl.mu.Lock()
			defer sl.mu.Unlock()
			return len(sl.queue) == n
		}, 10*time.Second, time.Millisecond)
	}
	// A write in flight, held at the server's door.
	g.closed.Store(true)
	held := make(chan error, 1)
	go func() {
		_, _, err := s.states.update(ctx, run, func(st *RunState) (bool, error) { st.Spend++; return true, nil })
		held <- err
	}()
	<-g.entered
	// Behind it: the envelope of call b, then the recording of turn 2.
	type result struct {
		st    *RunState
		known bool
		err   error
	}
	got := make(chan result, 1)
	go func() {
		st, known, err := s.withCall(ctx, run, id('b'), func(st *RunState, c *PendingCall) bool {
			if c.Done {
				return false
			}
			c.Done = true
			return true
		})
		got <- result{st, known, err}
	}()
	queued(1)
	recorded := make(chan error, 1)
	go func() {
		_, _, err := s.states.update(ctx, run, func(st *RunState) (bool, error) { return st.recordTurn(&turn2), nil })
		recorded <- err
	}()
	queued(2)
	g.closed.Store(false)
	close(g.open)

	require.NoError(t, <-held)
	require.NoError(t, <-recorded)
	r := <-got
	require.NoError(t, r.err)
	require.True(t, r.known, "a call of the run's current turn")
	require.True(t, r.st.call(id('b')).Done, "the envelope was applied")
	require.False(t, r.st.call(id('c')).Done)
	st, _, err := s.states.read(ctx, run)
	require.NoError(t, err)
	require.True(t, st.call(id('b')).Done, "and written")
}

// The envelope of a call while the run calls its model for a turn that is
// not stored yet is kept for another try (an error), not dropped as a call
// of no run: the turn is published before its calls are approved, so the
// envelope can only be early for it, or a stale read's.
func TestEnvelopeBeforeItsTurnIsStoredIsTriedAgain(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	kv, err := env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	s := &Service{states: newStateStore(kv), history: &history{js: env.JS}}
	s.Log = slog.New(slog.DiscardHandler)
	s.history.runs, err = env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	const run = "early-1"
	o, err := events.NewRunRequested("/test", envelope.RunRequest{RunID: run, Tenant: envelope.Tenant{OrgID: "acme"},
		Agent:    envelope.Agent{Name: "a", Model: envelope.Model{Provider: "scripted", Name: "m"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, o)
	_, err = s.states.create(ctx, &RunState{V: stateVersion, RunID: run, Iteration: 1, Phase: PhaseCalling, Trigger: triggerRequest})
	require.NoError(t, err)
	called := false
	_, known, err := s.withCall(ctx, run, strings.Repeat("d", 64), func(*RunState, *PendingCall) bool { called = true; return true })
	require.ErrorIs(t, err, errNotRecorded)
	require.ErrorContains(t, err, "turn 1 is not recorded yet")
	require.False(t, known)
	require.False(t, called)
}
