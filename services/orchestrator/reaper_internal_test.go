package orchestrator

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

func TestDeadlineFor(t *testing.T) {
	s := &Service{cfg: Config{RunDeadline: 30 * time.Minute}}
	for _, tc := range []struct {
		name string
		req  envelope.RunRequest
		want time.Duration
	}{
		{"the server's default", envelope.RunRequest{}, 30 * time.Minute},
		{"the request's", envelope.RunRequest{DeadlineS: 90}, 90 * time.Second},
		{"with approvals: their default timeout added", envelope.RunRequest{Agent: envelope.Agent{Policy: envelope.Policy{
			RequireApproval: &envelope.ApprovalPolicy{Writes: true}}}}, 45 * time.Minute},
		{"with approvals: their timeout added", envelope.RunRequest{Agent: envelope.Agent{Policy: envelope.Policy{
			RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"send_email"}}, ApprovalTimeoutS: 3600}}}, 90 * time.Minute},
		{"an approval policy that asks for none", envelope.RunRequest{Agent: envelope.Agent{Policy: envelope.Policy{
			RequireApproval: &envelope.ApprovalPolicy{}}}}, 30 * time.Minute},
		{"the request's wins over approvals", envelope.RunRequest{DeadlineS: 60, Agent: envelope.Agent{Policy: envelope.Policy{
			RequireApproval: &envelope.ApprovalPolicy{Writes: true}}}}, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, s.deadlineFor(&tc.req)) })
	}
}

// The reason says what the run waited for, whatever it was.
func TestDeadlineReason(t *testing.T) {
	at := time.Date(2026, 11, 26, 15, 0, 0, 0, time.UTC)
	base := RunState{RunID: "r1", Deadline: at, Model: events.ModelRef{Provider: "openai", Name: "gpt-4o"}}
	calling := base
	calling.Phase, calling.Iteration = PhaseCalling, 2
	require.Equal(t, "run r1 passed its deadline (2026-11-26T15:00:00Z) while waiting for the model (openai/gpt-4o, iteration 2). "+
		"Check the model provider and the orchestrators' logs (TOOLWIRE_MODEL_TIMEOUT bounds one model call); "+
		"raise the request's deadline_s (or TOOLWIRE_RUN_DEADLINE) if the run needs longer", deadlineReason(&calling, nil))

	waiting := base
	waiting.Phase, waiting.Iteration = PhaseAwaitingTools, 1
	waiting.Pending = []PendingCall{
		{CallID: "aa", Name: "echo", Version: "1.0.0", Done: true},
		{CallID: "bb", Name: "send_email", Version: "1.0.0", Approval: ApprovalWaiting},
		{CallID: "cc", Name: "gpu_job", Version: "2.0.0"},
	}
	r := deadlineReason(&waiting, map[string]string{"cc": "gpu"})
	require.Contains(t, r, "in iteration 1, waiting for an operator's decision on call bb (send_email@1.0.0): decide sooner with `toolwire approve`")
	require.Contains(t, r, "waiting for call cc (gpu_job@2.0.0, queue gpu): check `toolwire dlq list`")
	require.NotContains(t, r, "call aa", "an answered call is not what it waited for")
}

// deadlineService is a Service with what its deadline timers use.
func deadlineService(t *testing.T, timerAfter time.Duration) (*Service, *eventstest.Env) {
	env := eventstest.Start(t)
	s := &Service{cfg: Config{TimerAfter: timerAfter}, deadlines: newDeadlines()}
	s.JS, s.Log = env.JS, slog.New(slog.DiscardHandler)
	return s, env
}

// A request whose handler failed, or could not hold it, is settled only
// once its run's deadline timer is stored: the handler's own outcome stands
// when it is, and a timer that could not be stored is returned in its place,
// never as a permanent failure, so that the request is handled again rather
// than dead-lettered without a deadline. A handler still at work after
// TimerAfter has the timer sent meanwhile.
func TestDeadlineArmedBeforeTheRequestIsAcknowledged(t *testing.T) {
	s, env := deadlineService(t, 50*time.Millisecond)
	ctx := t.Context()
	deadline := time.Now().Add(time.Minute)

	poison := consume.Permanent(errors.New("poison"))
	require.Equal(t, poison, s.startDeadline("armed", deadline).armed(ctx, poison, nil), "the timer is stored: the handler's outcome stands")
	stream, err := env.JS.Stream(ctx, provision.StreamTimers)
	require.NoError(t, err)
	_, err = stream.GetLastMsgForSubject(ctx, "toolwire.timer.run.armed")
	require.NoError(t, err, "stored before armed returned")

	// A handler still at work after TimerAfter (a slow model call, or one
	// that hangs) has its run's timer sent meanwhile.
	slow := s.startDeadline("slow", deadline)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := stream.GetLastMsgForSubject(ctx, "toolwire.timer.run.slow")
		require.NoError(c, err)
	}, 10*time.Second, 10*time.Millisecond, "sent while the handler still runs")
	require.NoError(t, slow.armed(ctx, nil, nil))

	require.NoError(t, env.JS.DeleteStream(ctx, provision.StreamTimers))
	lost := s.startDeadline("lost", deadline)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = lost.armed(wctx, poison, nil)
	require.ErrorContains(t, err, "arm timer toolwire.timer.run.lost")
	require.ErrorContains(t, err, "poison")
	require.False(t, consume.IsPermanent(err), "handled again, not dead-lettered without a deadline")

	err = s.startDeadline("lost", deadline).armed(wctx, nil, nil)
	require.ErrorContains(t, err, "arm timer toolwire.timer.run.lost")
	require.Empty(t, s.deadlines.m, "every timer let go")
}

// A request whose handler succeeded is held: it is acknowledged without a
// timer when its run ends first, and once its timer is stored when
// TimerAfter passes first; a run that ended while its handler ran stores no
// timer either; at Stop, the requests still held get their timers.
func TestDeadlineTimerOnlyForARunThatOutlastsTimerAfter(t *testing.T) {
	s, env := deadlineService(t, 300*time.Millisecond)
	ctx := t.Context()
	r := startHolding(t, s, env, "quick", "ends-in-handler", "long")
	defer func() { require.NoError(t, r.Stop(context.Background())) }()
	timers, err := env.JS.Stream(ctx, provision.StreamTimers)
	require.NoError(t, err)
	stored := func(runID string) bool {
		_, err := timers.GetLastMsgForSubject(ctx, "toolwire.timer.run."+runID)
		return err == nil
	}

	r.request("quick")
	require.Equal(t, 1, r.pending(), "held while the run goes on")
	s.runEnded("quick")
	require.Eventually(t, func() bool { return r.pending() == 0 }, 5*time.Second, 10*time.Millisecond, "acknowledged when the run ended")
	time.Sleep(500 * time.Millisecond) // past TimerAfter
	require.False(t, stored("quick"), "a run that ended sooner stores no timer")

	r.request("ends-in-handler")
	require.Eventually(t, func() bool { return r.pending() == 0 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.False(t, stored("ends-in-handler"))

	r.request("long")
	require.Equal(t, 1, r.pending())
	require.Eventually(t, func() bool { return stored("long") && r.pending() == 0 }, 5*time.Second, 10*time.Millisecond,
		"past TimerAfter: the timer is stored, then the request acknowledged")
	s.runEnded("long") // too late to matter
	require.Empty(t, s.deadlines.m, "every timer let go")

	s2 := &Service{cfg: Config{TimerAfter: time.Hour}, deadlines: newDeadlines()}
	s2.JS, s2.Log = env.JS, s.Log
	r2 := startHolding(t, s2, env, "at-stop")
	r2.request("at-stop")
	require.Equal(t, 1, r2.pending())
	require.NoError(t, r2.Stop(ctx))
	require.NoError(t, s2.stopDeadlines(ctx))
	require.True(t, stored("at-stop"), "Stop stores the timer of a request still held")
	require.Zero(t, r2.pending(), "and acknowledges it")
	require.Empty(t, s2.deadlines.m)
}

// holding is a runner of run requests whose handler does what the
// orchestrator's does with a run's deadline, and nothing else; a run id
// starting with "ends-in-handler" ends while its handler runs.
type holding struct {
	*consume.Runner
	t       *testing.T
	pub     *publish.Publisher
	cons    jetstream.Consumer
	handled chan struct{}
}

func startHolding(t *testing.T, s *Service, env *eventstest.Env, runIDs ...string) *holding {
	t.Helper()
	ctx := t.Context()
	filters := make([]string, len(runIDs))
	for i, id := range runIDs {
		filters[i], _ = events.RunSubject(id, "requested")
	}
	durable := "test-" + runIDs[0]
	h := &holding{t: t, pub: publish.NewPublisher(env.JS), handled: make(chan struct{}, 8)}
	deadline := time.Now().Add(time.Minute)
	var err error
	h.Runner, err = consume.NewRunner(env.JS, consume.RunnerConfig{Spec: provision.ConsumerSpec{
		Stream: events.StreamRuns, Durable: durable, Filters: filters, AckWait: time.Second,
	}, Logger: s.Log, Handler: func(ctx context.Context, d *consume.Delivery) (err error) {
		runID := strings.Split(d.Subject, ".")[2]
		timer := s.startDeadline(runID, deadline)
		defer func() { err = timer.armed(ctx, err, d); h.handled <- struct{}{} }()
		if strings.HasPrefix(runID, "ends-in-handler") {
			s.runEnded(runID)
		}
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	h.cons, err = env.JS.Consumer(ctx, events.StreamRuns, durable)
	require.NoError(t, err)
	return h
}

// request publishes runID's request and waits until its handler returned.
func (h *holding) request(runID string) {
	h.t.Helper()
	out, err := events.NewRunRequested("/test", envelope.RunRequest{RunID: runID}, events.RunTrace{})
	require.NoError(h.t, err)
	require.NoError(h.t, h.pub.Publish(h.t.Context(), out))
	select {
	case <-h.handled:
	case <-time.After(10 * time.Second):
		h.t.Fatal("request not handled")
	}
}

// pending is how many requests are unacknowledged.
func (h *holding) pending() int {
	info, err := h.cons.Info(h.t.Context())
	require.NoError(h.t, err)
	return info.NumAckPending
}
