package events_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

func TestIntakeSubjects(t *testing.T) {
	cases := []struct {
		tenant  envelope.Tenant
		subject string
		filter  string
	}{
		{envelope.Tenant{OrgID: "acme"}, "toolwire.intake.acme._.r1", "toolwire.intake.acme.>"},
		{envelope.Tenant{OrgID: "acme", WorkspaceID: "ws-1", UserID: "u@x"}, "toolwire.intake.acme.ws-1.r1", "toolwire.intake.acme.ws-1.*"},
		{envelope.Tenant{OrgID: "A_b-9"}, "toolwire.intake.A_b-9._.r1", "toolwire.intake.A_b-9.>"},
	}
	for _, tc := range cases {
		subj, err := events.IntakeSubject(tc.tenant, "r1")
		require.NoError(t, err)
		require.Equal(t, tc.subject, subj)
		filter, err := events.IntakeFilter(tc.tenant.OrgID, tc.tenant.WorkspaceID)
		require.NoError(t, err)
		require.Equal(t, tc.filter, filter)
		in, err := events.ParseIntakeSubject(subj)
		require.NoError(t, err)
		require.Equal(t, events.IntakeOf{Org: tc.tenant.OrgID, Workspace: tc.tenant.WorkspaceID, RunID: "r1"}, in)
		require.NoError(t, in.Check(envelope.RunRequest{RunID: "r1", Tenant: tc.tenant}))
	}

	// A tenant an intake subject cannot name is refused with what to change.
	for _, bad := range []envelope.Tenant{
		{OrgID: ""}, {OrgID: "acme.corp"}, {OrgID: "acme corp"}, {OrgID: "*"}, {OrgID: ">"},
		{OrgID: strings.Repeat("a", 65)}, {OrgID: "acme", WorkspaceID: "_"}, {OrgID: "acme", WorkspaceID: "w.1"},
		{OrgID: "ünï"},
	} {
		_, err := events.IntakeSubject(bad, "r1")
		require.ErrorIs(t, err, events.ErrIntakeTenant, "%+v", bad)
		_, err = events.IntakeFilter(bad.OrgID, bad.WorkspaceID)
		require.ErrorIs(t, err, events.ErrIntakeTenant, "%+v", bad)
	}
	_, err := events.IntakeSubject(envelope.Tenant{OrgID: "acme"}, "r.1")
	require.ErrorIs(t, err, events.ErrUnsafeID)

	for _, bad := range []string{
		"", "toolwire.intake.acme._", "toolwire.intake.acme._.r1.x", "toolwire.run.acme._.r1",
		"other.intake.acme._.r1", "toolwire.intake.*._.r1", "toolwire.intake.acme._.*", "toolwire.intake..._",
	} {
		_, err := events.ParseIntakeSubject(bad)
		require.Error(t, err, bad)
	}

	// The request must be the subject's: its run, its org, its workspace.
	in := events.IntakeOf{Org: "acme", Workspace: "ws", RunID: "r1"}
	for _, req := range []envelope.RunRequest{
		{RunID: "r2", Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "ws"}},
		{RunID: "r1", Tenant: envelope.Tenant{OrgID: "globex", WorkspaceID: "ws"}},
		{RunID: "r1", Tenant: envelope.Tenant{OrgID: "acme"}},
		{RunID: "r1", Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "other"}},
	} {
		require.ErrorIs(t, in.Check(req), events.ErrIntakeTenant, "%+v", req)
	}
}

func TestNewRunIntakeIsTheRequestOnTheIntakeSubject(t *testing.T) {
	req := envelope.RunRequest{RunID: "r1", Tenant: envelope.Tenant{OrgID: "acme"}}
	in, err := events.NewRunIntake("/p", req, events.RunTrace{})
	require.NoError(t, err)
	direct, err := events.NewRunRequested("/p", req, events.RunTrace{})
	require.NoError(t, err)
	require.Equal(t, "toolwire.intake.acme._.r1", in.Subject)
	require.Equal(t, in.Subject, in.MsgID, "deduped per tenant")
	m, err := in.Msg()
	require.NoError(t, err)
	require.Equal(t, in.Subject, m.Header.Get(events.HeaderMsgID))
	require.Equal(t, direct.Event.ID(), in.Event.ID(), "one id: a request handed in twice is one request")
	require.Equal(t, direct.Event.Type(), in.Event.Type())
	require.Equal(t, direct.Event.Data(), in.Event.Data())

	_, err = events.NewRunIntake("/p", envelope.RunRequest{RunID: "r1", Tenant: envelope.Tenant{OrgID: "a.b"}}, events.RunTrace{})
	require.ErrorIs(t, err, events.ErrIntakeTenant)
}

func FuzzParseIntakeSubject(f *testing.F) {
	for _, s := range []string{"toolwire.intake.acme._.r1", "toolwire.intake.a.b.c", "toolwire.intake.acme._.r1.x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		in, err := events.ParseIntakeSubject(s)
		if err != nil {
			return
		}
		// What parses is a subject IntakeSubject writes again.
		again, err := events.IntakeSubject(envelope.Tenant{OrgID: in.Org, WorkspaceID: in.Workspace}, in.RunID)
		require.NoError(t, err)
		require.Equal(t, s, again)
	})
}
