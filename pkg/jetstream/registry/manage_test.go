package registry_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

func TestRegister(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	v1 := def("send_email", "1.0.0")

	created, err := r.Register(ctx, v1)
	require.NoError(t, err)
	require.True(t, created)
	e, err := r.Get(ctx, v1.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State)

	// Again, the same definition (its schema spelled otherwise): nothing
	// changes, whatever the state.
	require.NoError(t, r.SetState(ctx, v1.Ref(), registry.StateDeprecated))
	same := v1
	same.InputSchema = json.RawMessage(`{ "type" : "object" }`)
	created, err = r.Register(ctx, same)
	require.NoError(t, err)
	require.False(t, created)
	e, err = r.Get(ctx, v1.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateDeprecated, e.State, "registering again does not reactivate")

	// A changed definition under the same version is refused.
	changed := v1
	changed.Description = "sends an email, now with attachments"
	_, err = r.Register(ctx, changed)
	require.ErrorIs(t, err, registry.ErrConflict)
	require.EqualError(t, err, "tool version already registered with another definition: send_email@1.0.0 (state deprecated); register the change as a new version")

	// A new version is a new entry; the old one stays as it was.
	v2 := changed
	v2.Version = "1.1.0"
	created, err = r.Register(ctx, v2)
	require.NoError(t, err)
	require.True(t, created)
	all, err := r.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 2)

	bad := v1
	bad.Version = "latest"
	_, err = r.Register(ctx, bad)
	require.ErrorIs(t, err, envelope.ErrInvalidTool)
}

// TestChangesSayWhoAndWhen: a registration and each state change record
// who made them and when; History gives the entry as each change left it,
// oldest first.
func TestChangesSayWhoAndWhen(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	v1 := def("audited", "1.0.0")
	_, err := r.RegisterAs(ctx, v1, "alice")
	require.NoError(t, err)
	require.NoError(t, r.SetStateAs(ctx, v1.Ref(), registry.StateDeprecated, "bob"))
	require.NoError(t, r.SetStateAs(ctx, v1.Ref(), registry.StateBlocked, "carol"))
	h, err := r.History(ctx, v1.Ref())
	require.NoError(t, err)
	var got []string
	for _, e := range h {
		got = append(got, string(e.State)+" by "+e.UpdatedBy)
		require.False(t, e.UpdatedAt.IsZero())
	}
	require.Equal(t, []string{"active by alice", "deprecated by bob", "blocked by carol"}, got)
	require.False(t, h[2].UpdatedAt.Before(h[0].UpdatedAt))
	_, err = r.History(ctx, envelope.ToolRef{Name: "never", Version: "1.0.0"})
	require.ErrorIs(t, err, registry.ErrNotFound)

	// Many changes: each is kept, up to the bucket's 64 per version, and
	// an MCP server's re-registration (EnsureAs) says who too.
	for i := range 40 {
		st := []registry.State{registry.StateActive, registry.StateDeprecated}[i%2]
		require.NoError(t, r.SetStateAs(ctx, v1.Ref(), st, fmt.Sprintf("op-%d", i)))
	}
	changed := v1
	changed.Description = "re-registered"
	require.NoError(t, r.EnsureAs(ctx, changed, "dave"))
	h, err = r.History(ctx, v1.Ref())
	require.NoError(t, err)
	require.Len(t, h, 3+40+1, "every change is kept")
	require.Equal(t, "op-39", h[len(h)-2].UpdatedBy)
	require.Equal(t, "dave", h[len(h)-1].UpdatedBy)
	require.Equal(t, registry.StateDeprecated, h[len(h)-1].State, "EnsureAs keeps the state")
}

func TestDecodeDefinition(t *testing.T) {
	good := `{
  "name": "send_email", "version": "1.0.0", "description": "Sends an email.",
  "input_schema": {"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}},
  "metadata": {"category": "api", "side_effects": "writes", "cache": "none"},
  "required_secrets": ["SMTP_PASSWORD"], "required_scopes": ["email:send"], "supports_preview": true,
  "implementation": {"kind": "http", "config": {"url": "https://mail.example/send",
    "secret_headers": {"Authorization": "Basic {{secret:SMTP_PASSWORD}}"}}}
}`
	d, err := registry.DecodeDefinition([]byte(good))
	require.NoError(t, err)
	require.Equal(t, []string{"SMTP_PASSWORD"}, d.RequiredSecrets)
	require.Equal(t, []string{"email:send"}, d.RequiredScopes)
	require.True(t, d.SupportsPreview)

	tests := []struct{ name, doc, err string }{
		{"not JSON", `{`, "invalid tool definition: unexpected EOF"},
		{"unknown field", strings.Replace(good, `"description"`, `"summary"`, 1), `unknown field "summary"`},
		{"trailing", good + ` {}`, "trailing content after the definition"},
		{"schema violation", strings.Replace(good, `"api"`, `"email"`, 1), "at /metadata/category"},
		{"bad secret name", strings.Replace(good, `"SMTP_PASSWORD"`, `"smtp-password"`, 1), "at /required_secrets/0"},
		{"input schema does not compile", strings.Replace(good, `"type": "object", "required"`, `"type": 7, "required"`, 1),
			"send_email@1.0.0: input_schema"},
		{"writes and cached", strings.Replace(good, `"cache": "none"`, `"cache": "forever"`, 1), "at /metadata"},
		{"http endpoint not http", strings.Replace(good, `https://mail.example/send`, `smtp://mail.example`, 1), "at /implementation/config/url"},
		{"http endpoint with user info", strings.Replace(good, `https://mail.example/send`, `https://bob:pw@mail.example/send`, 1), "at /implementation/config/url"},
		{"http endpoint missing", strings.Replace(good, `"config": {"url": "https://mail.example/send",`, `"config": {`, 1), "at /implementation/config"},
		{"http tool without config", `{"name": "ping", "version": "1.0.0", "input_schema": {"type": "object"},
		  "metadata": {"category": "api", "side_effects": "reads", "cache": "none"}, "implementation": {"kind": "http"}}`, "at /implementation: missing property 'config'"},
		{"http endpoint with a bad port", strings.Replace(good, `https://mail.example/send`, `https://mail.example:0/send`, 1),
			`send_email@1.0.0: implementation.config: url "https://mail.example:0/send": port "0" is not a number from 1 to 65535`},
		{"http secret not declared", strings.Replace(good, `{{secret:SMTP_PASSWORD}}`, `{{secret:SMTP_PASS}}`, 1),
			"header Authorization names the secret SMTP_PASS, which required_secrets does not list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := registry.DecodeDefinition([]byte(tt.doc))
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestFilterAndCheckTools(t *testing.T) {
	mk := func(name, version string, cat envelope.Category, st registry.State) registry.Entry {
		d := def(name, version)
		d.Metadata.Category = cat
		d.Description = "does " + name
		return registry.Entry{Definition: d, State: st}
	}
	// An http tool stored before endpoints were checked.
	unrunnable := mk("fetch", "1.0.0", envelope.CategoryAPI, registry.StateActive)
	unrunnable.Definition.Implementation = envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"file:///etc/passwd"}`)}
	entries := []registry.Entry{
		unrunnable,
		mk("web_search", "1.0.0", envelope.CategorySearch, registry.StateDeprecated),
		mk("web_search", "2.0.0", envelope.CategorySearch, registry.StateActive),
		mk("send_email", "1.0.0", envelope.CategoryAPI, registry.StateBlocked),
		mk("calculator", "1.0.0", envelope.CategoryUtility, registry.StateActive),
	}
	names := func(es []registry.Entry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Definition.Ref().String())
		}
		return out
	}
	tests := []struct {
		name string
		f    registry.Filter
		want []string
	}{
		{"all", registry.Filter{}, []string{"fetch@1.0.0", "web_search@1.0.0", "web_search@2.0.0", "send_email@1.0.0", "calculator@1.0.0"}},
		{"search by name, any case", registry.Filter{Search: "SEARCH"}, []string{"web_search@1.0.0", "web_search@2.0.0"}},
		{"search the description", registry.Filter{Search: "does calc"}, []string{"calculator@1.0.0"}},
		{"category", registry.Filter{Category: envelope.CategoryAPI}, []string{"fetch@1.0.0", "send_email@1.0.0"}},
		{"states", registry.Filter{States: []registry.State{registry.StateActive}}, []string{"fetch@1.0.0", "web_search@2.0.0", "calculator@1.0.0"}},
		{"all of them", registry.Filter{Search: "web", States: []registry.State{registry.StateActive}, Category: envelope.CategorySearch},
			[]string{"web_search@2.0.0"}},
		{"nothing", registry.Filter{Search: "zzz"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, names(registry.Select(entries, tt.f)))
		})
	}

	f := registry.CheckTools(registry.LookupIn(entries),
		[]string{"web_search@1.0.0", "web_search@2.0.0", "send_email@1.0.0", "ghost@1.0.0", "broken", "fetch@1.0.0"})
	require.Equal(t, []string{"tool web_search@1.0.0 is deprecated"}, f.Warnings)
	require.Equal(t, []string{
		"tool send_email@1.0.0 is blocked",
		"unknown tool ghost@1.0.0",
		`invalid tool reference "broken": want name@version`,
		`tool fetch@1.0.0 cannot run: invalid tool definition fetch@1.0.0: implementation.config: url "file:///etc/passwd": scheme must be http or https`,
	}, f.Problems)

	clean := registry.CheckTools(registry.LookupIn(entries), []string{"calculator@1.0.0"})
	require.Empty(t, clean.Warnings)
	require.Empty(t, clean.Problems)

	st, err := registry.ParseState("blocked")
	require.NoError(t, err)
	require.Equal(t, registry.StateBlocked, st)
	_, err = registry.ParseState("retired")
	require.ErrorContains(t, err, `state "retired" is not one of active, deprecated, blocked`)
}
