package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
)

// intake hands req in on the intake subject of tenant (which may not be the
// request's own: a forgery).
func intake(ctx context.Context, t *testing.T, h *orchestratortest.Harness, tenant envelope.Tenant, req envelope.RunRequest) {
	t.Helper()
	out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
	require.NoError(t, err)
	out.Subject, err = events.IntakeSubject(tenant, req.RunID)
	require.NoError(t, err)
	out.MsgID = out.Subject // as NewRunIntake
	require.NoError(t, h.Pub.Publish(ctx, out))
}

// deadLetter waits for the dead letter of the intake on subject.
func deadLetter(ctx context.Context, t *testing.T, h *orchestratortest.Harness, subject string) events.DeadLetter {
	t.Helper()
	dlq, err := h.Env.JS.Stream(ctx, events.StreamDLQ)
	require.NoError(t, err)
	var dl events.DeadLetter
	require.Eventually(t, func() bool {
		m, err := dlq.GetLastMsgForSubject(ctx, events.DLQSubject(events.StreamIntake, orchestrator.DurableIntake))
		if err != nil {
			return false
		}
		dl = events.DeadLetterOf(m)
		return dl.Subject == subject
	}, 20*time.Second, 20*time.Millisecond, "dead letter of %s", subject)
	return dl
}

// TestIntake: a tenant's request handed in on its intake subject becomes the
// run's request and the run completes; one handed in twice is one run; a
// request whose tenant is not its intake subject's, or whose run id is
// another tenant's run, is dead-lettered with the reason and makes no run
// (nor joins the other tenant's).
func TestIntake(t *testing.T) {
	h := orchestratortest.New(t)
	h.Start("o1", orchestrator.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	acme := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1", UserID: "u1"}
	globex := envelope.Tenant{OrgID: "globex"}
	script := map[string]any{"content": "done"}

	req := orchestratortest.Scripted(t, "in-1", nil, envelope.Policy{}, script)
	req.Tenant = acme
	intake(ctx, t, h, acme, req)
	intake(ctx, t, h, acme, req) // a producer's retry
	st, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, st.Status, st.Reason)
	runs, err := h.Env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	info, err := runs.Info(ctx, jetstream.WithSubjectFilter("toolwire.run.in-1.requested"))
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Subjects["toolwire.run.in-1.requested"], "one request")

	// Another tenant's request in acme's subject, and acme's run id in
	// globex's intake: both refused, neither a run.
	forged := orchestratortest.Scripted(t, "in-2", nil, envelope.Policy{}, script)
	forged.Tenant = globex
	intake(ctx, t, h, acme, forged)
	dl := deadLetter(ctx, t, h, "toolwire.intake.acme.ws1.in-2")
	require.Contains(t, dl.Error, `tenant.org_id "globex" is not the intake subject's "acme"`)
	require.Equal(t, uint64(1), dl.Deliveries, "refused at once, not retried")

	takeover := orchestratortest.Scripted(t, "in-1", nil, envelope.Policy{}, script)
	takeover.Tenant = globex
	intake(ctx, t, h, globex, takeover)
	dl = deadLetter(ctx, t, h, "toolwire.intake.globex._.in-1")
	require.Contains(t, dl.Error, "run in-1 is another tenant's")

	// What is not a run request is refused too.
	bad, err := events.NewRunStatus("/toolwire/test", events.RunStatus{RunID: "in-3", Status: events.StatusCompleted}, "", events.RunTrace{})
	require.NoError(t, err)
	bad.Subject = "toolwire.intake.acme.ws1.in-3"
	require.NoError(t, h.Pub.Publish(ctx, bad))
	dl = deadLetter(ctx, t, h, bad.Subject)
	require.Contains(t, dl.Error, "the intake takes "+events.TypeRunRequested+" only")

	for _, id := range []string{"in-2", "in-3"} {
		_, err := runs.GetLastMsgForSubject(ctx, "toolwire.run."+id+".>")
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "%s made no run", id)
	}
	// in-1 is still acme's run, and the intake holds nothing: each request
	// was taken, handed over or refused.
	m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run.in-1.requested")
	require.NoError(t, err)
	require.Equal(t, acme.ID(), m.Header.Get("ce-"+events.ExtTenantID))
	in, err := h.Env.JS.Stream(ctx, events.StreamIntake)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := in.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "the intake is a work queue")
}
