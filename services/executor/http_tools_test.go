package executor

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/secrets"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// httpDef is a registry entry of kind http: name@1.0.0 with config and
// secrets, an input schema that wants a city, and an output schema that
// wants temp_c.
func httpDef(name string, side envelope.SideEffects, config string, secrets ...string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: "1.0.0", Description: "an HTTP endpoint",
		InputSchema:     json.RawMessage(`{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}`),
		OutputSchema:    json.RawMessage(`{"type":"object","required":["temp_c"],"properties":{"temp_c":{"type":"number"}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: side, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(config)},
		RequiredSecrets: secrets,
	}
}

// TestHTTPToolsThroughTheExecutor runs registered http tools as the default
// queue's executors run them: the secrets resolved from the store sent as
// headers (and scrubbed from what comes back), the idempotency key on a
// writes tool, the tool's timeout, the output schema, the status mapping,
// the guard's allow-list from the executor's web configuration.
func TestHTTPToolsThroughTheExecutor(t *testing.T) {
	type seen struct {
		path, body, auth, idem string
	}
	var (
		mu    sync.Mutex
		calls []seen
	)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, seen{r.URL.Path, string(b), r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key")})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/weather":
			// Echoes the key it got: the envelope must not show it.
			_, _ = io.WriteString(w, `{"temp_c":21.5,"echo":`+mustJSON(r.Header.Get("Authorization"))+`}`)
		case "/send":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"temp_c":0,"sent":true}`)
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/warm":
			_, _ = io.WriteString(w, `{"temp_c":"warm"}`)
		case "/text":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, `sunny`)
		case "/refuse":
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"unknown city"}`)
		case "/down":
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	other := newServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"temp_c":1}`) })

	env := eventstest.Start(t)
	keys := testKeyring(t)
	startExecutor(t, env, Config{ID: "executor-http"},
		WithWebConfig(web.Config{AllowHosts: []string{srv.Listener.Addr().String()}}), WithKeyring(keys))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.WorkspaceScope("acme", "ws"), "WEATHER_KEY", []byte(canaryValue)))

	reg := openRegistry(t, env.JS)
	for _, def := range []envelope.ToolDefinition{
		httpDef("weather", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/weather","secret_headers":{"Authorization":"Bearer {{secret:WEATHER_KEY}}"}}`, "WEATHER_KEY"),
		httpDef("send", envelope.SideEffectsWrites, `{"url":"`+srv.URL+`/send"}`),
		func() envelope.ToolDefinition {
			d := httpDef("slow", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/slow"}`)
			d.TimeoutMS = 100
			return d
		}(),
		httpDef("warm", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/warm"}`),
		httpDef("text", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/text"}`),
		httpDef("refuse", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/refuse"}`),
		httpDef("down", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/down"}`),
		httpDef("elsewhere", envelope.SideEffectsReads, `{"url":"`+other.URL+`/"}`),
	} {
		created, err := reg.Register(t.Context(), def)
		require.NoError(t, err)
		require.True(t, created)
	}
	// An entry stored before configs were checked: its calls say why it
	// cannot run.
	kv, err := env.JS.KeyValue(t.Context(), events.BucketTools)
	require.NoError(t, err)
	legacy := httpDef("legacy", envelope.SideEffectsReads, "")
	legacy.Implementation.Config = nil
	b, err := json.Marshal(registry.Entry{Definition: legacy, State: registry.StateActive, UpdatedAt: time.Now()})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), registry.Key(legacy.Ref()), b)
	require.NoError(t, err)

	schemas := newEventSchemas(t)
	const runID = "run-http"
	w := watchRun(t, env.JS, runID)
	tests := []struct {
		tool, input string
		out         string
		code        envelope.ErrorCode
		msg         string
	}{
		{tool: "weather", input: `{"city":"Lyon"}`, out: `{"temp_c":21.5,"echo":"Bearer [REDACTED:WEATHER_KEY]"}`},
		{tool: "send", input: `{"city":"Lyon","text":"hi"}`, out: `{"temp_c":0,"sent":true}`},
		{tool: "slow", input: `{"city":"Lyon"}`, code: envelope.CodeTimeout, msg: "tool slow@1.0.0 timed out after 100ms"},
		{tool: "warm", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "output of tool warm@1.0.0 does not match its output schema"},
		{tool: "text", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "text@1.0.0: " + srv.Listener.Addr().String() + " answered a body that is not JSON (text/plain)"},
		{tool: "refuse", input: `{"city":"Atlantis"}`, code: envelope.CodeValidation, msg: "refuse@1.0.0: " + srv.Listener.Addr().String() + " refused the request: 422 Unprocessable Entity"},
		{tool: "down", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "answered 502 Bad Gateway"},
		{tool: "elsewhere", input: `{"city":"Lyon"}`, code: envelope.CodePolicyDenied, msg: "elsewhere@1.0.0: destination 127.0.0.1 is a loopback address: refused (allow it with TOOLWIRE_HTTP_ALLOW_HOSTS)"},
		{tool: "weather", input: `{"town":"Lyon"}`, code: envelope.CodeValidation, msg: "input for tool weather@1.0.0 does not match its input schema"},
		{tool: "legacy", input: `{"city":"Lyon"}`, code: envelope.CodeUnknown, msg: `tool legacy@1.0.0 cannot run: implementation.config: an http tool needs {"url": ...}`},
	}
	reqs := make([]events.CallRequest, len(tests))
	for i, tc := range tests {
		reqs[i] = callRequest(t, runID, i+1, tc.tool, "1.0.0", tc.input)
	}
	publishAllApproved(t, env.JetStream(t), reqs)
	for i, tc := range tests {
		t.Run(tc.tool+"/"+tc.input, func(t *testing.T) {
			got := w.envelopeOf(t, schemas, reqs[i])
			if tc.code == "" {
				require.Nil(t, got.Error)
				require.JSONEq(t, tc.out, string(got.Output))
				return
			}
			require.NotNil(t, got.Error)
			require.Equal(t, tc.code, got.Error.Code, got.Error.Message)
			require.Contains(t, got.Error.Message, tc.msg)
		})
	}
	require.NotContains(t, string(w.wait(t, completedSubject(t, reqs[0])).Data()), canaryValue)

	mu.Lock()
	defer mu.Unlock()
	byPath := map[string]seen{}
	for _, c := range calls {
		byPath[c.path] = c
	}
	require.Equal(t, seen{"/weather", `{"city":"Lyon"}`, "Bearer " + canaryValue, ""}, byPath["/weather"], "the secret as a header; no key on a reads tool")
	require.Equal(t, seen{"/send", `{"city":"Lyon","text":"hi"}`, "", runID + "." + reqs[1].CallID}, byPath["/send"], "the run's call as the idempotency key")
	require.Len(t, calls, 7, "weather, send, slow, warm, text, refuse, down; nothing else: %v", calls)
}
