package executor

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// authTool uses its secret API_KEY: it echoes its auth, logs it, and with
// {"fail": true} fails with it in its message and details; with
// {"encoded": true} it does so with the key encoded (encodedKey). It can
// preview.
type authTool struct{ name string }

func (a authTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: a.name, Version: "1.0.0", Description: "uses API_KEY",
		InputSchema:     json.RawMessage(`{"type":"object","properties":{"fail":{"type":"boolean"},"encoded":{"type":"boolean"}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:  toolapi.BuiltinImplementation("test_" + a.name),
		RequiredSecrets: []string{"API_KEY"},
		SupportsPreview: true,
	}
}

func (a authTool) Execute(_ context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	var in struct {
		Fail    bool `json:"fail"`
		Encoded bool `json:"encoded"`
	}
	_ = json.Unmarshal(input, &in)
	key := tc.Auth["API_KEY"]
	if in.Encoded {
		e := encodedKey(key)
		tc.Log.Info("calling upstream", "authorization", e.basic, "raw", []byte(key), "hex", strings.ToUpper(e.hex))
		if in.Fail {
			return nil, envelope.NewToolError(envelope.CodeProviderError, "upstream rejected Authorization: %s", e.basic).
				WithDetails(map[string]any{"sent_hex": e.hex, "url": e.url})
		}
		return json.Marshal(map[string]any{
			"headers": map[string]string{"Authorization": e.basic, "X-Key": e.hex},
			"body":    e.body, "url": e.url, "escaped": e.escaped,
		})
	}
	tc.Log.Info("calling upstream with key "+key, "key", key, "header", "Bearer "+key)
	if in.Fail {
		return nil, envelope.NewToolError(envelope.CodeProviderError, "upstream rejected key %s", key).
			WithDetails(map[string]any{"sent": "Bearer " + key})
	}
	return json.Marshal(map[string]any{"ok": true, "auth": tc.Auth, "note": "used " + key})
}

func (a authTool) Preview(_ context.Context, _ json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"would_send_with": tc.Auth["API_KEY"], "changes": "nothing"})
}

// encoded is a key as a tool may echo it: in a basic-auth header (base64 at
// an offset), in a binary body shown as base64, in hex, in a URL with every
// byte percent-encoded in lower case, and in upper case.
type encoded struct{ basic, body, hex, url, escaped string }

func encodedKey(key string) encoded {
	var pct strings.Builder
	for _, c := range []byte(key) {
		fmt.Fprintf(&pct, "%%%02x", c)
	}
	return encoded{
		basic:   "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+key)),
		body:    base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n" + key + "\x00\x01")),
		hex:     hex.EncodeToString([]byte(key)),
		url:     "https://api.example.com/v1?p=" + pct.String(),
		escaped: "k=" + strings.ToUpper(pct.String()),
	}
}

// leaks are spellings of key that nothing published or logged may hold.
func leaks(key string) []string {
	e := encodedKey(key)
	mid := func(s string) string { return s[len(s)/2-8 : len(s)/2+8] }
	return []string{key, base64.StdEncoding.EncodeToString([]byte(key)), base64.RawURLEncoding.EncodeToString([]byte(key)),
		mid(e.basic), mid(e.body), e.hex, strings.ToUpper(e.hex), e.url[len("https://api.example.com/v1?p="):], e.escaped[2:]}
}

func testKeyring(t testing.TB) *secrets.Keyring {
	t.Helper()
	k, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)), "")
	require.NoError(t, err)
	return k
}

const canaryValue = "canary-7f3b9e2d-secret-value"

func TestSecretsResolvedScopedAndScrubbed(t *testing.T) {
	env := eventstest.Start(t)
	logs := &servicetest.Output{}
	d := testDeps(t, env, nil)
	d.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	keys := testKeyring(t)
	startExecutorWith(t, d, Config{ID: "ex-1"}, WithTools(authTool{name: "auth_echo"}), WithKeyring(keys))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	schemas := newEventSchemas(t)
	pub := publish.NewPublisher(env.JetStream(t))

	tests := []struct {
		name      string
		set       []secrets.Scope
		input     string
		scope     string
		warned    bool
		code      envelope.ErrorCode
		message   string
		toolNotRn bool
		encoded   bool
	}{
		{name: "org key: a warning", set: []secrets.Scope{secrets.OrgScope("acme")}, input: `{}`, scope: "org", warned: true},
		{name: "workspace key wins", set: []secrets.Scope{secrets.OrgScope("acme"), secrets.WorkspaceScope("acme", "ws")}, input: `{}`, scope: "workspace"},
		{name: "user key wins", set: []secrets.Scope{secrets.OrgScope("acme"), secrets.UserScope("acme", "u1")}, input: `{}`, scope: "user"},
		{name: "failure with the key in it", set: []secrets.Scope{secrets.UserScope("acme", "u1")}, input: `{"fail":true}`, scope: "user",
			code: envelope.CodeProviderError, message: "upstream rejected key [REDACTED:API_KEY]"},
		{name: "encoded spellings", set: []secrets.Scope{secrets.UserScope("acme", "u1")}, input: `{"encoded":true}`, scope: "user", encoded: true},
		{name: "failure with the key encoded in it", set: []secrets.Scope{secrets.UserScope("acme", "u1")}, input: `{"encoded":true,"fail":true}`, scope: "user",
			code: envelope.CodeProviderError, encoded: true},
		{name: "missing", input: `{}`, code: envelope.CodeAuthRequired,
			message: "tool auth_echo@1.0.0 needs secret API_KEY, set for none of this tenant's scopes (user, workspace, org): set it with `toolwire secrets set`"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Each case has its own org, so that keys of one do not leak into
			// the next.
			org := "acme" + string(rune('a'+i))
			for _, sc := range tt.set {
				sc.OrgID = org
				require.NoError(t, store.Set(t.Context(), sc, "API_KEY", []byte(canaryValue)))
			}
			runID := "run-sec-" + string(rune('a'+i))
			req := callRequest(t, runID, 1, "auth_echo", "1.0.0", tt.input)
			req.Tenant = envelope.Tenant{OrgID: org, WorkspaceID: "ws", UserID: "u1"}
			w := watchRun(t, env.JS, runID)
			publishApproved(t, pub, req)

			got := w.envelopeOf(t, schemas, req)
			startedSubj, err := events.CallSubject(runID, req.CallID, "started")
			require.NoError(t, err)
			var cs events.CallStarted
			if tt.scope != "" {
				// A quick call that resolved secrets still publishes its
				// started event, the record of their scopes, stored before
				// its completed event.
				started := w.wait(t, startedSubj)
				require.NoError(t, schemas.Validate(events.SchemaCallStarted, started.Data()))
				require.NoError(t, events.DecodeData(started, &cs))
				require.Less(t, streamSeq(t, env.JS, startedSubj), streamSeq(t, env.JS, completedSubject(t, req)), "started is stored before completed")
			} else {
				// Nothing resolved: a quick call publishes no started event.
				require.Zero(t, count(t, env.JS, startedSubj))
			}

			switch {
			case tt.code == "" && tt.encoded:
				require.Nil(t, got.Error)
				require.Equal(t, 5, strings.Count(string(got.Output), "[REDACTED:API_KEY]"), "%s", got.Output)
			case tt.code == "":
				require.Nil(t, got.Error)
				require.JSONEq(t, `{"ok":true,"auth":{"API_KEY":"[REDACTED:API_KEY]"},"note":"used [REDACTED:API_KEY]"}`, string(got.Output))
			case tt.encoded:
				require.Equal(t, tt.code, got.Error.Code)
				require.Contains(t, got.Error.Message, "[REDACTED:API_KEY]")
				details, err := json.Marshal(got.Error.Details)
				require.NoError(t, err)
				require.Equal(t, 2, strings.Count(string(details), "[REDACTED:API_KEY]"), "%s", details)
			default:
				require.NotNil(t, got.Error)
				require.Equal(t, tt.code, got.Error.Code)
				require.Equal(t, tt.message, got.Error.Message)
			}
			if tt.scope != "" {
				require.Equal(t, map[string]string{"API_KEY": tt.scope}, cs.SecretScopes)
			} else {
				require.Empty(t, cs.SecretScopes)
				require.Equal(t, map[string]any{"missing": []any{"API_KEY"}}, got.Error.Details)
			}
			if tt.warned {
				require.Equal(t, []string{"secret API_KEY of tool auth_echo@1.0.0 falls back to the org scope (org " + org + "): no user or workspace key is set"}, cs.Warnings)
			} else {
				require.Empty(t, cs.Warnings)
			}
			// Nothing published holds the value.
			subjects := []string{completedSubject(t, req)}
			if tt.scope != "" {
				subjects = append(subjects, startedSubj)
			}
			for _, subj := range subjects {
				data := string(w.wait(t, subj).Data())
				for _, l := range leaks(canaryValue) {
					require.NotContains(t, data, l)
				}
			}
		})
	}
	out := logs.String()
	require.Contains(t, out, "calling upstream with key [REDACTED:API_KEY]", "the tool logged, scrubbed")
	for _, l := range leaks(canaryValue) {
		require.NotContains(t, out, l)
	}
}

func TestSecretsWithoutMasterKey(t *testing.T) {
	env := eventstest.Start(t)
	startExecutor(t, env, Config{}, WithTools(authTool{name: "auth_echo"}))
	schemas := newEventSchemas(t)
	req := callRequest(t, "run-nokey", 1, "auth_echo", "1.0.0", `{}`)
	w := watchRun(t, env.JS, req.RunID)
	publishApproved(t, publish.NewPublisher(env.JetStream(t)), req)
	got := w.envelopeOf(t, schemas, req)
	require.Equal(t, &envelope.ToolError{Code: envelope.CodeAuthRequired,
		Message: "tool auth_echo@1.0.0 needs secrets (API_KEY), and this executor holds no master key to open them"}, got.Error)

	// Keys from the environment; malformed ones stop Build, and the
	// message does not show them.
	d := testDeps(t, env, nil)
	d.Getenv = servicetest.Getenv(map[string]string{secrets.EnvMasterKeys: "k1:not-base64"})
	_, err := Build(d)
	require.ErrorContains(t, err, `TOOLWIRE_MASTER_KEYS: key "k1" is not standard base64`)
	require.NotContains(t, err.Error(), "not-base64")
	d.Getenv = servicetest.Getenv(map[string]string{
		secrets.EnvMasterKeys: "k1:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)),
	})
	s, err := Build(d)
	require.NoError(t, err)
	require.Equal(t, "k1", s.secrets.keys.CurrentID())

	// Of several keys, TOOLWIRE_MASTER_KEY_ID names the current one.
	two := "k1:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)) +
		",k2:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	d.Getenv = servicetest.Getenv(map[string]string{secrets.EnvMasterKeys: two, secrets.EnvMasterKeyID: "k2"})
	s, err = Build(d)
	require.NoError(t, err)
	require.Equal(t, "k2", s.Config().Keyring.CurrentID())
}

// A sealed value moved to another tenant's key does not open: the call fails
// with AUTH_REQUIRED, and the executor's log says why.
func TestSecretsTamperedValue(t *testing.T) {
	env := eventstest.Start(t)
	keys := testKeyring(t)
	startExecutor(t, env, Config{}, WithTools(authTool{name: "auth_echo"}), WithKeyring(keys))
	other, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32)), "")
	require.NoError(t, err)
	store, err := secrets.Open(t.Context(), env.JS, other) // sealed under a key the executor does not hold
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.OrgScope("acme"), "API_KEY", []byte(canaryValue)))
	schemas := newEventSchemas(t)
	req := callRequest(t, "run-tamper", 1, "auth_echo", "1.0.0", `{}`)
	w := watchRun(t, env.JS, req.RunID)
	publishApproved(t, publish.NewPublisher(env.JetStream(t)), req)
	got := w.envelopeOf(t, schemas, req)
	require.Equal(t, envelope.CodeAuthRequired, got.Error.Code)
	require.Equal(t, "tool auth_echo@1.0.0: secret API_KEY cannot be opened with this executor's master keys: set it again", got.Error.Message)
}

func TestPreviewRequests(t *testing.T) {
	env := eventstest.Start(t)
	keys := testKeyring(t)
	startExecutor(t, env, Config{}, WithTools(authTool{name: "auth_echo"}, newTestTool("plain", nil)), WithKeyring(keys))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.OrgScope("acme"), "API_KEY", []byte(canaryValue)))
	nc := env.Connect(t)

	ask := func(req events.CallRequest) events.ApprovalPreview {
		t.Helper()
		b, err := json.Marshal(req)
		require.NoError(t, err)
		resp, err := nc.RequestWithContext(t.Context(), events.SubjectPreview, b)
		require.NoError(t, err)
		var p events.ApprovalPreview
		require.NoError(t, json.Unmarshal(resp.Data, &p))
		require.NotContains(t, string(resp.Data), canaryValue)
		return p
	}
	p := ask(callRequest(t, "run-pv", 1, "auth_echo", "1.0.0", `{}`))
	require.Empty(t, p.Unavailable)
	require.JSONEq(t, `{"would_send_with":"[REDACTED:API_KEY]","changes":"nothing"}`, string(p.Output))

	p = ask(callRequest(t, "run-pv", 2, "plain", "1.0.0", `{}`))
	require.Equal(t, "preview unavailable: tool plain@1.0.0 does not declare supports_preview", p.Unavailable)
	p = ask(callRequest(t, "run-pv", 3, "ghost", "1.0.0", `{}`))
	require.Equal(t, "preview unavailable: unknown tool ghost@1.0.0", p.Unavailable)
	p = ask(callRequest(t, "run-pv", 4, "auth_echo", "1.0.0", `{"fail":"yes"}`))
	require.Equal(t, "preview unavailable: the arguments do not match the input schema of auth_echo@1.0.0", p.Unavailable)
	bad := callRequest(t, "run-pv", 5, "auth_echo", "1.0.0", `{}`)
	bad.RunID = "bad.run"
	p = ask(bad)
	require.True(t, strings.HasPrefix(p.Unavailable, "preview unavailable: unsafe subject token"), p.Unavailable)
	resp, err := nc.RequestWithContext(t.Context(), events.SubjectPreview, []byte(`nope`))
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), "the request is not a call")
	require.NotErrorIs(t, err, nats.ErrNoResponders)
}
