package stack_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
)

// canary is the secret's value: a string that appears nowhere else.
const canary = "CANARY-5d1e8c0a-9b7f-4e2a-b6c3-secret"

// leakyTool uses its secret API_KEY as carelessly as a tool can: it echoes
// its auth, puts the key in its messages, logs it, returns it in a plain
// error and panics with it.
type leakyTool struct{}

func (leakyTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "leaky", Version: "1.0.0", Description: "Calls an API with API_KEY, carelessly",
		InputSchema:     json.RawMessage(`{"type":"object","required":["mode"],"properties":{"mode":{"enum":["echo","fail","boom","panic"]}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:  toolapi.BuiltinImplementation("stack_leaky"),
		RequiredSecrets: []string{"API_KEY"},
	}
}

func (leakyTool) Execute(_ context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	var in struct{ Mode string }
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	key := tc.Auth["API_KEY"]
	tc.Log.Info("calling the API with key "+key, "api_key", key, "authorization", "Bearer "+key)
	switch in.Mode {
	case "fail":
		return nil, envelope.NewToolError(envelope.CodeProviderError, "the API refused key %s", key).
			WithDetails(map[string]any{"request_headers": map[string]string{"Authorization": "Bearer " + key}})
	case "boom":
		return nil, fmt.Errorf("connection reset while sending key %s", key)
	case "panic":
		panic("cannot go on with key " + key)
	}
	return json.Marshal(map[string]any{"auth": tc.Auth, "message": "authenticated with " + key})
}

// TestSecretCanary: a secret whose value is a unique string is used by a tool
// that echoes it, fails with it, logs it, errs and panics with it. Then every
// event of every stream (and every KV bucket and object but the sealed
// secrets), every log line, every span and every Postgres row of the run is
// searched: the canary appears nowhere.
func TestSecretCanary(t *testing.T) {
	dsn := pgtest.Schema(t)
	logs := &servicetest.Output{}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	keys, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{42}, 32)), "")
	require.NoError(t, err)
	st := startStack(t, stack.Options{
		Recorder: recorder.ForStack(dsn), Tracer: tp,
		Logger:          slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ExecutorOptions: []executor.Option{executor.WithTools(leakyTool{}), executor.WithKeyring(keys)},
	})
	store, err := secrets.Open(t.Context(), st.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.WorkspaceScope("org1", "ws1"), "API_KEY", []byte(canary)))

	const runID = "canary-run-1"
	modes := []string{"echo", "fail", "boom", "panic"}
	var calls []any
	for _, m := range modes {
		calls = append(calls, call("leaky", map[string]any{"mode": m}))
	}
	final := runToEnd(t, st, scripted(t, runID, []string{"leaky@1.0.0"},
		map[string]any{"tool_calls": calls}, map[string]any{"content": "done"}))
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)

	// The tool really ran with the secret, four times, and was scrubbed.
	byMode := map[string]envelope.ToolEnvelope{}
	for i, m := range modes {
		byMode[m] = envelopeAt(t, final, i+1)
	}
	require.Nil(t, byMode["echo"].Error)
	require.JSONEq(t, `{"auth":{"API_KEY":"[REDACTED:API_KEY]"},"message":"authenticated with [REDACTED:API_KEY]"}`, string(byMode["echo"].Output))
	require.Equal(t, "the API refused key [REDACTED:API_KEY]", byMode["fail"].Error.Message)
	require.Equal(t, map[string]any{"request_headers": map[string]any{"Authorization": "Bearer [REDACTED:API_KEY]"}}, byMode["fail"].Error.Details)
	require.Equal(t, envelope.CodeUnknown, byMode["boom"].Error.Code)
	require.Equal(t, envelope.CodeUnknown, byMode["panic"].Error.Code)

	// Wait until the recorder has every event of the run, then search.
	want := countRunEvents(t, st.JS, runID)
	servicetest.PollUntil(t, 30*time.Second, fmt.Sprintf("the recorder has the run's %d events", want),
		func() bool { return recordedEvents(t, st.HTTPURL, runID) >= want })
	servicetest.PollUntil(t, 10*time.Second, "the executor logged the panic",
		func() bool { return strings.Contains(logs.String(), "tool panicked") })

	sources := map[string]string{
		"streams, KV buckets and objects": dumpJetStream(t, st.JS),
		"log lines":                       logs.String(),
		"spans":                           dumpSpans(spans),
		"postgres rows":                   dumpPostgres(t, dsn),
	}
	for name, text := range sources {
		require.Contains(t, text, runID, "%s: the dump holds the run (a control that it is not empty)", name)
		if i := strings.Index(text, canary); i >= 0 {
			lo, hi := max(0, i-300), min(len(text), i+len(canary)+100)
			t.Fatalf("the canary appears in the %s: ...%s...", name, text[lo:hi])
		}
	}
	// What was logged was logged scrubbed: the tool's own line, the executor's
	// error and panic lines.
	for _, line := range []string{`"msg":"calling the API with key [REDACTED:API_KEY]"`,
		`connection reset while sending key [REDACTED:API_KEY]`, `cannot go on with key [REDACTED:API_KEY]`} {
		require.Contains(t, sources["log lines"], line)
	}
	require.Contains(t, sources["streams, KV buckets and objects"], `"secret_scopes":{"API_KEY":"workspace"}`, "the scope is on the timeline")
}

// countRunEvents counts the run's messages in the run and call streams.
func countRunEvents(t *testing.T, js jetstream.JetStream, runID string) int {
	t.Helper()
	n := 0
	for stream, filter := range map[string]string{
		events.StreamRuns: "toolwire.run." + runID + ".>", events.StreamCalls: "toolwire.call." + runID + ".>",
	} {
		s, err := js.Stream(t.Context(), stream)
		require.NoError(t, err)
		info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(filter))
		require.NoError(t, err)
		for _, c := range info.State.Subjects {
			n += int(c)
		}
	}
	return n
}

func recordedEvents(t *testing.T, base, runID string) int {
	t.Helper()
	code, body := get(t, base+"/v1/runs/"+runID+"/events?limit=1000")
	if code != http.StatusOK {
		return 0
	}
	var page struct {
		Events []json.RawMessage `json:"events"`
	}
	if json.Unmarshal(body, &page) != nil {
		return 0
	}
	return len(page.Events)
}

// dumpJetStream renders every message of every stream but the sealed
// secrets' (events, dead letters, KV buckets, object store chunks): subject,
// headers and data.
func dumpJetStream(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	ctx := t.Context()
	var b strings.Builder
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if name == "KV_"+provision.BucketSecrets {
			continue // sealed: the store's own tests check that no value is in clear
		}
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			require.NoError(t, err)
			fmt.Fprintf(&b, "%s %d %s %v %s\n", name, seq, m.Subject, m.Header, m.Data)
		}
	}
	require.NoError(t, names.Err())
	return b.String()
}

// dumpSpans renders every span: name, attributes, status, events and their
// attributes, links.
func dumpSpans(rec *tracetest.SpanRecorder) string {
	var b strings.Builder
	all := rec.Ended()
	for _, s := range rec.Started() {
		all = append(all, s)
	}
	for _, s := range all {
		fmt.Fprintf(&b, "span %q status=%v %q attrs=%v\n", s.Name(), s.Status().Code, s.Status().Description, s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&b, "  event %q %v\n", e.Name, e.Attributes)
		}
		for _, l := range s.Links() {
			fmt.Fprintf(&b, "  link %v\n", l.Attributes)
		}
	}
	return b.String()
}

// dumpPostgres renders every row of every table of the test's schema as text.
func dumpPostgres(t *testing.T, dsn string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	var b strings.Builder
	for _, table := range tables {
		rows, err := conn.Query(ctx, "SELECT t::text FROM "+pgx.Identifier{table}.Sanitize()+" t")
		require.NoError(t, err)
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for _, r := range texts {
			fmt.Fprintf(&b, "%s: %s\n", table, r)
		}
	}
	return b.String()
}
