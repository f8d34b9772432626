package publish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// failures is an Observer and a log that count and keep the failed
// publishes.
type failures struct {
	mu     sync.Mutex
	byType map[string]int
	logBuf bytes.Buffer
}

func (f *failures) PublishFailed(eventType string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byType == nil {
		f.byType = map[string]int{}
	}
	f.byType[eventType]++
}

func (f *failures) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logBuf.Write(b)
}

func (f *failures) counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.byType {
		out[k] = v
	}
	return out
}

// lines are the log's records, decoded.
func (f *failures) lines(t *testing.T) []map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(f.logBuf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

func observed(env *eventstest.Env) (*publish.Publisher, *failures) {
	f := &failures{}
	return publish.NewPublisher(env.JS, publish.WithObserver(f),
		publish.WithLogger(slog.New(slog.NewJSONHandler(f, nil)))), f
}

// requireLogged asserts a failure's log line: an error, with its subject,
// event id and type.
func requireLogged(t *testing.T, line map[string]any, out events.Outgoing) {
	t.Helper()
	require.Equal(t, "ERROR", line["level"])
	require.Equal(t, out.Subject, line["subject"])
	require.Equal(t, out.Event.ID(), line["event_id"])
	require.Equal(t, out.Event.Type(), line["event_type"])
	require.NotEmpty(t, line["err"])
}

// A publish to a subject no stream takes fails: its error is returned,
// logged with its subject and event id, and counted by event type; one that
// succeeds, or a PublishFirst refused because its subject holds an event,
// is none.
func TestPublishFailuresAreLoggedAndCounted(t *testing.T) {
	env := eventstest.Start(t)
	pub, f := observed(env)
	ctx := testCtx(t)

	require.NoError(t, pub.Publish(ctx, callStarted(t, 1)))
	stored, err := pub.PublishFirst(ctx, callStarted(t, 1))
	require.NoError(t, err)
	require.False(t, stored)
	require.Empty(t, f.counts(), "no failure yet")

	nowhere := callStarted(t, 2)
	nowhere.Subject = "nowhere.at.all"
	require.Error(t, pub.Publish(ctx, nowhere))
	require.Equal(t, map[string]int{events.TypeCallStarted: 1}, f.counts())
	lines := f.lines(t)
	require.Len(t, lines, 1)
	requireLogged(t, lines[0], nowhere)

	_, err = pub.PublishFirst(ctx, nowhere)
	require.Error(t, err)
	other := eventstest.CallCompleted(t, 3, `{"results":[]}`)
	other.Subject = "nowhere.either"
	require.Error(t, pub.PublishAll(ctx, []events.Outgoing{callStarted(t, 4), nowhere, other}))
	require.Equal(t, map[string]int{events.TypeCallStarted: 3, events.TypeCallCompleted: 1}, f.counts())
	lines = f.lines(t)
	require.Len(t, lines, 4)
	requireLogged(t, lines[3], other)

	pd, err := pub.PublishAsync(ctx, other)
	require.NoError(t, err)
	require.Error(t, pd.Wait(ctx))
	require.Error(t, pd.Retry(ctx))
	require.Equal(t, map[string]int{events.TypeCallStarted: 3, events.TypeCallCompleted: 3}, f.counts(),
		"a failed Wait and a failed Retry count once each")
}

// A publish to a stopped server fails, logged and counted.
func TestPublishToAStoppedServerIsCounted(t *testing.T) {
	env := eventstest.Start(t)
	pub, f := observed(env)
	embedded.Stop(env.Server)
	ctx, cancel := context.WithTimeout(testCtx(t), 500*time.Millisecond)
	defer cancel()
	out := callStarted(t, 1)
	require.Error(t, pub.Publish(ctx, out))
	require.Equal(t, map[string]int{events.TypeCallStarted: 1}, f.counts())
	lines := f.lines(t)
	require.Len(t, lines, 1)
	requireLogged(t, lines[0], out)
}

// A Pending dropped without Wait is not lost silently: once it is
// collected, its failed publish is logged and counted. One whose event was
// stored counts nothing.
func TestADroppedPendingIsNotLostSilently(t *testing.T) {
	env := eventstest.Start(t)
	pub, f := observed(env)
	ctx := testCtx(t)

	stored := callStarted(t, 1)
	nowhere := callStarted(t, 2)
	nowhere.Subject = "nowhere.at.all"
	for _, out := range []events.Outgoing{stored, nowhere} {
		_, err := pub.PublishAsync(ctx, out) // dropped at once
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return f.counts()[events.TypeCallStarted] > 0
	}, 10*time.Second, 20*time.Millisecond, "the dropped Pending was never reported")
	time.Sleep(100 * time.Millisecond) // the stored one has had its chance to count, wrongly
	require.Equal(t, map[string]int{events.TypeCallStarted: 1}, f.counts())
	lines := f.lines(t)
	require.Len(t, lines, 1)
	requireLogged(t, lines[0], nowhere)
	require.Contains(t, lines[0]["msg"], "dropped without Wait")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls))
}
