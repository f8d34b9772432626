package direct_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBatch: a filter's messages come in order, in batches of at most n,
// with whether more are stored; past the last, nothing and no error.
func TestBatch(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	_, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}, AllowDirect: true})
	require.NoError(t, err)
	const total = direct.MaxBatch + 44
	for i := range total {
		_, err := env.JS.Publish(ctx, fmt.Sprintf("d.a.%d", i), fmt.Appendf(nil, "%d", i))
		require.NoError(t, err)
		_, err = env.JS.Publish(ctx, "d.b", nil) // not in the filter
		require.NoError(t, err)
	}
	var got []string
	from, batches := uint64(0), 0
	for {
		msgs, more, err := direct.Batch(ctx, env.JS, "D", "d.a.>", from, 0)
		require.NoError(t, err)
		batches++
		require.LessOrEqual(t, len(msgs), direct.MaxBatch)
		for _, m := range msgs {
			require.Greater(t, m.Sequence, from)
			got = append(got, string(m.Data))
			require.Equal(t, "d.a."+string(m.Data), m.Subject)
			from = m.Sequence
		}
		from++
		if !more {
			break
		}
	}
	require.Equal(t, 2, batches)
	require.Len(t, got, total)
	for i, v := range got {
		require.Equal(t, fmt.Sprint(i), v)
	}
	msgs, more, err := direct.Batch(ctx, env.JS, "D", "d.a.>", from, 10)
	require.NoError(t, err)
	require.Empty(t, msgs)
	require.False(t, more)
	msgs, _, err = direct.Batch(ctx, env.JS, "D", "d.none", 1, 10)
	require.NoError(t, err)
	require.Empty(t, msgs)

	_, _, err = direct.Batch(ctx, env.JS, "MISSING", "d.>", 1, 10)
	require.ErrorIs(t, err, direct.ErrRead)
}

// TestJetStream: on a server without accounts the plain API is used.
func TestJetStream(t *testing.T) {
	env := eventstest.Start(t)
	js, err := direct.JetStream(t.Context(), env.JS.Conn())
	require.NoError(t, err)
	require.Equal(t, "$JS.API", direct.APIPrefix(js))
}

// TestLast: the last message on a subject or a wildcard comes with its
// headers from the leader; none stored is ErrNotStored; an unknown stream
// is an error that is not ErrNotStored.
func TestLast(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	_, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "L", Subjects: []string{"l.>"}, AllowDirect: true})
	require.NoError(t, err)
	for i, subj := range []string{"l.a.x", "l.b.y", "l.a.z", "l.b.y"} {
		m := nats.NewMsg(subj)
		m.Header.Set("N", fmt.Sprint(i))
		m.Data = fmt.Appendf(nil, "%d", i)
		_, err := env.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	cases := []struct {
		subject, want, header string
		seq                   uint64
	}{
		{"l.a.x", "0", "0", 1},
		{"l.a.*", "2", "2", 3},
		{"l.>", "3", "3", 4},
	}
	for _, c := range cases {
		m, err := direct.Last(ctx, env.JS, "L", c.subject)
		require.NoError(t, err, c.subject)
		require.Equal(t, c.want, string(m.Data), c.subject)
		require.Equal(t, c.header, m.Header.Get("N"), c.subject)
		require.Equal(t, c.seq, m.Sequence, c.subject)
	}
	_, err = direct.Last(ctx, env.JS, "L", "l.none")
	require.ErrorIs(t, err, direct.ErrNotStored)
	_, err = direct.Last(ctx, env.JS, "NOPE", "l.a.x")
	require.Error(t, err)
	require.NotErrorIs(t, err, direct.ErrNotStored)
}

// TestCount: the messages on a subject or a wildcard are counted, every
// one stored on it (not one per subject); none stored is zero; an unknown
// stream is an error.
func TestCount(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	_, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "C", Subjects: []string{"c.>"}})
	require.NoError(t, err)
	for _, subj := range []string{"c.a.x", "c.b.y", "c.a.z", "c.b.y", "c.a.x"} {
		_, err := env.JS.Publish(ctx, subj, nil)
		require.NoError(t, err)
	}
	for filter, want := range map[string]uint64{"c.a.x": 2, "c.a.*": 3, "c.b.>": 2, "c.>": 5, "c.none": 0} {
		n, err := direct.Count(ctx, env.JS, "C", filter)
		require.NoError(t, err, filter)
		require.Equal(t, want, n, filter)
	}
	_, err = direct.Count(ctx, env.JS, "NOPE", "c.>")
	require.ErrorIs(t, err, direct.ErrRead)
}

// TestRunEnd: a run's end of either kind is found on the leader; a run
// without one (a started event only) has none.
func TestRunEnd(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	for _, st := range []events.RunStatus{
		{RunID: "r-started", Status: events.StatusStarted},
		{RunID: "r-done", Status: events.StatusCompleted},
		{RunID: "r-failed", Status: events.StatusFailed, Reason: "model call failed"},
	} {
		out, err := events.NewRunStatus("/test", st, "", events.RunTrace{})
		require.NoError(t, err)
		env.Publish(t, out)
	}
	for run, want := range map[string]string{"r-started": "", "r-done": "toolwire.run.r-done.completed",
		"r-failed": "toolwire.run.r-failed.failed", "r-none": ""} {
		m, err := direct.RunEnd(ctx, env.JS, run)
		require.NoError(t, err, run)
		if want == "" {
			require.Nil(t, m, run)
			continue
		}
		require.NotNil(t, m, run)
		require.Equal(t, want, m.Subject, run)
	}
}
