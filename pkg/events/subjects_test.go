package events_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

const (
	runID  = "run_2025-03-14_001"
	callID = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

// subjectCase is one builder call and the exact subject it must build: the
// subject of docs/architecture.md's event table (Events), with each '*'
// filled in.
type subjectCase struct {
	name  string
	build func() (string, error)
	want  string
}

// designSubjects covers every subject of the event table of
// docs/architecture.md (Events).
func designSubjects() []subjectCase {
	var cs []subjectCase
	for _, verb := range []events.Verb{"requested", "started", "suspended", "resumed", "completed", "failed"} {
		cs = append(cs, subjectCase{"run " + string(verb), func() (string, error) { return events.RunSubject(runID, verb) },
			"toolwire.run." + runID + "." + string(verb)})
	}
	cs = append(cs, subjectCase{"turn completed", func() (string, error) { return events.TurnSubject(runID, 12) },
		"toolwire.run." + runID + ".turn.12.completed"})
	cs = append(cs, subjectCase{"call approved", func() (string, error) { return events.ApprovedSubject(runID, callID, "text") },
		"toolwire.call." + runID + "." + callID + ".approved.text"})
	for _, verb := range []events.Verb{"approval_required", "decided", "started", "completed"} {
		cs = append(cs, subjectCase{"call " + string(verb), func() (string, error) { return events.CallSubject(runID, callID, verb) },
			"toolwire.call." + runID + "." + callID + "." + string(verb)})
	}
	for _, verb := range []events.Verb{"requested", "completed"} {
		cs = append(cs, subjectCase{"sandbox " + string(verb), func() (string, error) { return events.SandboxSubject(runID, callID, verb) },
			"toolwire.sandbox." + runID + "." + callID + "." + string(verb)})
	}
	return cs
}

func TestSubjectBuilders(t *testing.T) {
	for _, tc := range designSubjects() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.build()
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestSubjectFilters(t *testing.T) {
	got, err := events.RunEvents(runID)
	require.NoError(t, err)
	require.Equal(t, "toolwire.run."+runID+".>", got)

	got, err = events.CallEvents(runID)
	require.NoError(t, err)
	require.Equal(t, "toolwire.call."+runID+".>", got)

	got, err = events.SandboxEvents(runID)
	require.NoError(t, err)
	require.Equal(t, "toolwire.sandbox."+runID+".>", got)
	sub, err := events.SandboxSubject(runID, callID, "requested")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(sub, strings.TrimSuffix(got, ">")), "%s is under %s", sub, got)

	_, err = events.RunEvents("a.b")
	require.ErrorIs(t, err, events.ErrUnsafeID)
	_, err = events.CallEvents("a>")
	require.ErrorIs(t, err, events.ErrUnsafeID)
}

func TestSubjectsRejectUnsafeRunIDs(t *testing.T) {
	unsafe := []struct{ name, id string }{
		{"empty", ""},
		{"dot", "a.b"},
		{"star", "a*"},
		{"gt", "a>"},
		{"space", "a b"},
		{"65 chars", strings.Repeat("a", 65)},
		{"unicode", "rün"},
		{"path", "../x"},
		{"newline", "a\nb"},
		{"trailing newline", "abc\n"},
		{"tab", "a\tb"},
	}
	builders := map[string]func(id string) (string, error){
		"RunSubject":      func(id string) (string, error) { return events.RunSubject(id, "requested") },
		"TurnSubject":     func(id string) (string, error) { return events.TurnSubject(id, 1) },
		"ApprovedSubject": func(id string) (string, error) { return events.ApprovedSubject(id, callID, "default") },
		"CallSubject":     func(id string) (string, error) { return events.CallSubject(id, callID, "completed") },
		"SandboxSubject":  func(id string) (string, error) { return events.SandboxSubject(id, callID, "requested") },
		"RunEvents":       events.RunEvents,
		"CallEvents":      events.CallEvents,
		"SandboxEvents":   events.SandboxEvents,
	}
	for _, tc := range unsafe {
		t.Run(tc.name, func(t *testing.T) {
			err := events.ValidateRunID(tc.id)
			require.ErrorIs(t, err, events.ErrUnsafeID)
			require.Contains(t, err.Error(), "run_id")
			require.Contains(t, err.Error(), "must be 1-64 letters, digits, '-' or '_'")
			for name, build := range builders {
				got, err := build(tc.id)
				require.ErrorIs(t, err, events.ErrUnsafeID, name)
				require.Empty(t, got, name)
			}
		})
	}
}

func TestValidateRunIDAcceptsSafeTokens(t *testing.T) {
	for _, id := range []string{"a", "A-Z_0-9", strings.Repeat("x", 64), runID} {
		require.NoError(t, events.ValidateRunID(id), id)
	}
}

func TestSubjectsRejectBadCallIDs(t *testing.T) {
	bad := []struct{ name, id string }{
		{"empty", ""},
		{"uppercase", strings.ToUpper(callID)},
		{"non-hex", "xyz"},
		{"65 chars", strings.Repeat("a", 65)},
		{"dot", "ab.cd"},
		{"wildcard", "ab*"},
		{"very long", strings.Repeat("f", 200)},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := events.ValidateCallID(tc.id)
			require.ErrorIs(t, err, events.ErrUnsafeID)
			require.Contains(t, err.Error(), "call_id")
			require.Contains(t, err.Error(), "lowercase hex")
			require.Less(t, len(err.Error()), 200, "a long id is cut in the message")

			_, err = events.CallSubject(runID, tc.id, "requested")
			require.ErrorIs(t, err, events.ErrUnsafeID)
			_, err = events.SandboxSubject(runID, tc.id, "requested")
			require.ErrorIs(t, err, events.ErrUnsafeID)
		})
	}
	require.NoError(t, events.ValidateCallID(strings.Repeat("a", 64)))
	require.NoError(t, events.ValidateCallID("0"))
}

func TestTurnSubjectRejectsNonPositive(t *testing.T) {
	for _, n := range []int{0, -1} {
		_, err := events.TurnSubject(runID, n)
		require.ErrorContains(t, err, "must be at least 1")
	}
}

// An approved call's subject names its queue: a queue is one safe token,
// CallSubject refuses the verb, and a worker's filter takes only its queue.
func TestApprovedSubjects(t *testing.T) {
	for _, q := range []string{"", "a.b", "*", ">", "Text", "with space", strings.Repeat("q", 65)} {
		_, err := events.ApprovedSubject(runID, callID, q)
		require.ErrorContains(t, err, "queue", "queue %q", q)
		_, err = events.ApprovedFilter(q)
		require.ErrorContains(t, err, "queue", "queue %q", q)
	}
	_, err := events.CallSubject(runID, callID, events.VerbApproved)
	require.ErrorContains(t, err, "ApprovedSubject")
	f, err := events.ApprovedFilter("text")
	require.NoError(t, err)
	require.Equal(t, "toolwire.call.*.*.approved.text", f)
	p, err := events.ParseSubject("toolwire.call." + runID + "." + callID + ".approved.text")
	require.NoError(t, err)
	require.Equal(t, events.VerbApproved, p.Verb)
	require.Equal(t, "text", p.Queue)
	for _, bad := range []string{"toolwire.call." + runID + "." + callID + ".approved.Te.xt",
		"toolwire.call." + runID + "." + callID + ".completed.text",
		"toolwire.sandbox." + runID + "." + callID + ".approved.text",
		"toolwire.call." + runID + "." + callID + ".approved.T"} {
		_, err := events.ParseSubject(bad)
		require.Error(t, err, bad)
	}
}

func TestSubjectBuildersRejectBadVerbs(t *testing.T) {
	for _, verb := range []events.Verb{"", "a.b", ">", "*", "with space", "Requested"} {
		t.Run(string(verb), func(t *testing.T) {
			builds := []func() (string, error){
				func() (string, error) { return events.RunSubject(runID, verb) },
				func() (string, error) { return events.CallSubject(runID, callID, verb) },
				func() (string, error) { return events.SandboxSubject(runID, callID, verb) },
			}
			for i, b := range builds {
				got, err := b()
				require.ErrorContains(t, err, "verb", "builder %d", i)
				require.Empty(t, got)
			}
		})
	}
}

func TestParseSubjectRoundTrip(t *testing.T) {
	for _, tc := range designSubjects() {
		t.Run(tc.name, func(t *testing.T) {
			subj, err := tc.build()
			require.NoError(t, err)
			p, err := events.ParseSubject(subj)
			require.NoError(t, err)
			require.Equal(t, runID, p.RunID)
			if p.Queue == "" {
				require.Equal(t, events.Verb(subj[strings.LastIndex(subj, ".")+1:]), p.Verb)
			}

			// Rebuild the subject from what was parsed.
			var again string
			switch {
			case p.Kind == "call" && p.Verb == events.VerbApproved:
				require.Equal(t, "text", p.Queue)
				again, err = events.ApprovedSubject(p.RunID, p.CallID, p.Queue)
			case p.Kind == "call":
				require.Equal(t, callID, p.CallID)
				again, err = events.CallSubject(p.RunID, p.CallID, p.Verb)
			case p.Kind == "sandbox":
				require.Equal(t, callID, p.CallID)
				again, err = events.SandboxSubject(p.RunID, p.CallID, p.Verb)
			case p.Kind == "run" && strings.Contains(subj, ".turn."):
				require.Equal(t, 12, p.Iteration)
				again, err = events.TurnSubject(p.RunID, p.Iteration)
			case p.Kind == "run":
				require.Zero(t, p.Iteration)
				require.Empty(t, p.CallID)
				again, err = events.RunSubject(p.RunID, p.Verb)
			default:
				t.Fatalf("unexpected kind %q", p.Kind)
			}
			require.NoError(t, err)
			require.Equal(t, subj, again)
		})
	}
}

func TestParseSubjectRejectsJunk(t *testing.T) {
	junk := []struct{ name, subject, msg string }{
		{"empty", "", "not a toolwire subject"},
		{"other prefix", "nats.run.r1.requested", "not a toolwire subject"},
		{"too short", "toolwire.run.r1", "not a toolwire subject"},
		{"unknown kind", "toolwire.job.r1.requested", "unknown kind"},
		{"dlq", "toolwire.dlq.TOOLWIRE_CALLS.executor", "unknown kind"},
		{"unsafe run id", "toolwire.run.a*.requested", "unsafe subject token"},
		{"run five tokens", "toolwire.run.r1.turn.completed", "wrong number of tokens"},
		{"run seven tokens", "toolwire.run.r1.turn.1.completed.x", "wrong number of tokens"},
		{"unknown run sub-subject", "toolwire.run.r1.iteration.1.requested", "unknown run sub-subject"},
		{"contract v1's llm subject", "toolwire.run.r1.llm.1.completed", "unknown run sub-subject"},
		{"turn not a number", "toolwire.run.r1.turn.x.completed", "positive number"},
		{"turn zero", "toolwire.run.r1.turn.0.completed", "positive number"},
		{"turn negative", "toolwire.run.r1.turn.-1.completed", "positive number"},
		{"turn leading zero", "toolwire.run.r1.turn.01.completed", "positive number"},
		{"turn plus sign", "toolwire.run.r1.turn.+1.completed", "positive number"},
		{"call four tokens", "toolwire.call.r1." + callID, "wrong number of tokens"},
		{"call six tokens", "toolwire.call.r1." + callID + ".x.completed", "wrong number of tokens"},
		{"bad call id", "toolwire.call.r1.XYZ.completed", "call_id"},
		{"bad sandbox call id", "toolwire.sandbox.r1.zz.requested", "call_id"},
		{"empty verb", "toolwire.run.r1.", "verb"},
		{"wildcard verb", "toolwire.call.r1." + callID + ".>", "verb"},
		{"star verb", "toolwire.run.r1.turn.2.*", "verb"},
	}
	for _, tc := range junk {
		t.Run(tc.name, func(t *testing.T) {
			p, err := events.ParseSubject(tc.subject)
			require.Error(t, err)
			require.ErrorContains(t, err, tc.msg)
			require.Zero(t, p)
		})
	}
}
