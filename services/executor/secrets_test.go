package executor

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
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
// {"fail": true} fails with it in its message and details. It can preview.
type authTool struct{ name string }

func (a authTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: a.name, Version: "1.0.0", Description: "uses API_KEY",
		InputSchema:     json.RawMessage(`{"type":"object","properties":{"fail":{"type":"boolean"}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:  toolapi.BuiltinImplementation("test_" + a.name),
		RequiredSecrets: []string{"API_KEY"},
		SupportsPreview: true,
	}
}

func (a authTool) Execute(_ context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	var in struct {
		Fail bool `json:"fail"`
	}
	_ = json.Unmarshal(input, &in)
	key := tc.Auth["API_KEY"]
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
	}{
		{name: "org key: a warning", set: []secrets.Scope{secrets.OrgScope("acme")}, input: `{}`, scope: "org", warned: true},
		{name: "workspace key wins", set: []secrets.Scope{secrets.OrgScope("acme"), secrets.WorkspaceScope("acme", "ws")}, input: `{}`, scope: "workspace"},
		{name: "user key wins", set: []secrets.Scope{secrets.OrgScope("acme"), secrets.UserScope("acme", "u1")}, input: `{}`, scope: "user"},
		{name: "failure with the key in it", set: []secrets.Scope{secrets.UserScope("acme", "u1")}, input: `{"fail":true}`, scope: "user",
			code: envelope.CodeProviderError, message: "upstream rejected key [REDACTED:API_KEY]"},
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

			switch tt.code {
			case "":
				require.Nil(t, got.Error)
				require.JSONEq(t, `{"ok":true,"auth":{"API_KEY":"[REDACTED:API_KEY]"},"note":"used [REDACTED:API_KEY]"}`, string(got.Output))
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
				require.NotContains(t, string(w.wait(t, subj).Data()), canaryValue)
			}
		})
	}
	out := logs.String()
	require.Contains(t, out, "calling upstream with key [REDACTED:API_KEY]", "the tool logged, scrubbed")
	require.NotContains(t, out, canaryValue)
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
