package orchestrator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
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

// A request is acknowledged only once its run's deadline timer is stored:
// the handler's own outcome stands when it is, and a timer that could not be
// stored is returned in its place, never as a permanent failure, so that the
// request is handled again rather than dead-lettered without a deadline.
func TestDeadlineArmedBeforeTheRequestIsAcknowledged(t *testing.T) {
	env := eventstest.Start(t)
	s := &Service{}
	s.JS = env.JS
	ctx := t.Context()
	deadline := time.Now().Add(time.Minute)

	poison := events.Permanent(errors.New("poison"))
	require.Equal(t, poison, s.startDeadline("armed", deadline).armed(ctx, poison), "the timer is stored: the handler's outcome stands")
	stream, err := env.JS.Stream(ctx, events.StreamTimers)
	require.NoError(t, err)
	_, err = stream.GetLastMsgForSubject(ctx, "toolwire.timer.run.armed")
	require.NoError(t, err, "stored before armed returned")

	// A handler still at work after armDeadlineWithin (a slow model call,
	// or one that hangs) has its run's timer sent meanwhile.
	slow := s.startDeadline("slow", deadline)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := stream.GetLastMsgForSubject(ctx, "toolwire.timer.run.slow")
		require.NoError(c, err)
	}, 10*time.Second, 10*time.Millisecond, "sent while the handler still runs")
	require.NoError(t, slow.armed(ctx, nil))

	require.NoError(t, env.JS.DeleteStream(ctx, events.StreamTimers))
	lost := s.startDeadline("lost", deadline)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = lost.armed(wctx, poison)
	require.ErrorContains(t, err, "arm timer toolwire.timer.run.lost")
	require.ErrorContains(t, err, "poison")
	require.False(t, events.IsPermanent(err), "handled again, not dead-lettered without a deadline")

	err = s.startDeadline("lost", deadline).armed(wctx, nil)
	require.ErrorContains(t, err, "arm timer toolwire.timer.run.lost")
}
