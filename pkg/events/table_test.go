package events_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// matches reports whether subject matches a filter of '*' wildcards (one
// token each), as NATS does.
func matches(filter events.Filter, subject string) bool {
	f, s := strings.Split(string(filter), "."), strings.Split(subject, ".")
	if len(f) != len(s) {
		return false
	}
	for i := range f {
		if f[i] != "*" && f[i] != s[i] {
			return false
		}
	}
	return true
}

// Every constructed event agrees with its type's row: the subject matches the
// row's filter and no other row's, the stream's subjects hold it, and its data
// decodes into the row's Go type.
func TestTableAgreesWithConstructors(t *testing.T) {
	streams := map[string]string{events.StreamRuns: events.SubjectsRuns, events.StreamCalls: events.SubjectsCalls,
		events.StreamSandbox: events.SubjectsSandbox}
	covered := map[string]bool{}
	for _, c := range append(allConstructors(t), sandboxConstructors(t)...) {
		t.Run(c.name, func(t *testing.T) {
			row, ok := events.LookupType(c.typ)
			require.True(t, ok, "type %s has a row", c.typ)
			covered[c.typ] = true
			require.True(t, matches(row.Filter, c.out.Subject), "subject %s matches %s", c.out.Subject, row.Filter)
			for _, other := range events.Table() {
				if other.Type != row.Type && other.Filter != row.Filter {
					require.False(t, matches(other.Filter, c.out.Subject), "subject %s also matches %s's filter", c.out.Subject, other.Type)
				}
			}
			prefix := strings.TrimSuffix(streams[row.Stream], ">")
			require.True(t, strings.HasPrefix(c.out.Subject, prefix), "stream %s holds %s", row.Stream, c.out.Subject)
			v := row.New()
			require.Equal(t, reflect.Pointer, reflect.TypeOf(v).Kind())
			require.NoError(t, events.DecodeData(&c.out.Event, v))
		})
	}
	for _, row := range events.Table() {
		require.True(t, covered[row.Type], "no constructor test builds a %s", row.Type)
		require.NotEmpty(t, row.Doc)
		require.NotEmpty(t, row.Schema)
	}
}

func TestFilterForRun(t *testing.T) {
	got, err := events.FilterCallCompleted.ForRun("run-1")
	require.NoError(t, err)
	require.Equal(t, "toolwire.call.run-1.*.completed", got)
	_, err = events.FilterCallCompleted.ForRun("a.b")
	require.ErrorIs(t, err, events.ErrUnsafeID)
	require.Equal(t, []string{"toolwire.run.*.requested"}, events.Filters(events.FilterRunRequested))
}

// sandboxConstructors builds one event of each type the constructor
// fixtures leave to their own tests.
func sandboxConstructors(t testing.TB) []constructed {
	t.Helper()
	must := func(o events.Outgoing, err error) events.Outgoing {
		t.Helper()
		require.NoError(t, err)
		return o
	}
	res := events.SandboxResult{RunID: runID, CallID: callID, Output: []byte(`{"words":2}`),
		Runtime: events.SandboxRuntimeGVisor, DurationMS: 210}
	return []constructed{
		{name: "sandbox job", out: must(events.NewSandboxJob("/t", fixtureSandboxJob(), runTrace)), typ: events.TypeSandboxRequested},
		{name: "sandbox result", out: must(events.NewSandboxResult("/t", res, tenant.ID(), runTrace)), typ: events.TypeSandboxCompleted},
	}
}
