package secrets_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

func keyring(t *testing.T, keys, current string) *secrets.Keyring {
	t.Helper()
	k, err := secrets.ParseKeyring(keys, current)
	require.NoError(t, err)
	return k
}

func open(t *testing.T, js jetstream.JetStream, k *secrets.Keyring) *secrets.Store {
	t.Helper()
	s, err := secrets.Open(t.Context(), js, k)
	require.NoError(t, err)
	return s
}

var (
	org  = secrets.OrgScope("acme")
	ws   = secrets.WorkspaceScope("acme", "research")
	user = secrets.UserScope("acme", "u-42")
	// A tenant whose ids hold characters no KV key may hold.
	odd = envelope.Tenant{OrgID: "Acme Inc.", WorkspaceID: "R&D / Paris", UserID: "jane@acme.example"}
)

func TestStoreSetGetListDelete(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := t.Context()
	require.True(t, s.CanOpen())

	require.NoError(t, s.Set(ctx, org, "API_KEY", []byte("org-value")))
	require.NoError(t, s.Set(ctx, org, "OTHER", []byte("other-value")))
	require.NoError(t, s.Set(ctx, ws, "API_KEY", []byte("ws-value")))
	got, err := s.Get(ctx, org, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "org-value", string(got))

	// Overwrite.
	require.NoError(t, s.Set(ctx, org, "API_KEY", []byte("org-value-2")))
	got, err = s.Get(ctx, org, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "org-value-2", string(got))

	infos, err := s.List(ctx, org)
	require.NoError(t, err)
	require.Len(t, infos, 2)
	require.Equal(t, "API_KEY", infos[0].Name)
	require.Equal(t, "OTHER", infos[1].Name)
	require.Equal(t, org, infos[0].Scope)
	require.Equal(t, "k1", infos[0].KeyID)
	require.WithinDuration(t, time.Now(), infos[0].UpdatedAt, time.Minute)

	// Nothing in the bucket holds a value in clear.
	requireNoPlaintext(t, env.JS, "org-value", "ws-value", "other-value")

	require.NoError(t, s.Delete(ctx, org, "API_KEY"))
	_, err = s.Get(ctx, org, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	require.ErrorContains(t, err, "secret API_KEY in org acme: secret not found")
	err = s.Delete(ctx, org, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	infos, err = s.List(ctx, org)
	require.NoError(t, err)
	require.Len(t, infos, 1)

	// The workspace's secret is untouched; its history is gone with a delete.
	kv, err := env.JS.KeyValue(ctx, provision.BucketSecrets)
	require.NoError(t, err)
	lister, err := kv.ListKeysFiltered(ctx, ">")
	require.NoError(t, err)
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	require.Len(t, keys, 2)
}

// requireNoPlaintext reads every revision of every key in the secrets bucket.
func requireNoPlaintext(t *testing.T, js jetstream.JetStream, values ...string) {
	t.Helper()
	stream, err := js.Stream(t.Context(), "KV_"+provision.BucketSecrets)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		for _, v := range values {
			require.NotContains(t, string(m.Data), v)
			require.NotContains(t, m.Subject, v)
		}
	}
}

func TestStoreResolvesNarrowestFirst(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := t.Context()
	tenant := envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-42"}

	_, err := s.Resolve(ctx, tenant, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	require.ErrorContains(t, err, "secret API_KEY for tenant acme/research/u-42: secret not found")

	steps := []struct {
		set   secrets.Scope
		value string
		want  secrets.Scope
	}{
		{org, "from-org", org},
		{ws, "from-ws", ws},
		{user, "from-user", user},
		{org, "org-again", user}, // a broader write never wins over a narrower one
	}
	for _, st := range steps {
		require.NoError(t, s.Set(ctx, st.set, "API_KEY", []byte(st.value)))
		r, err := s.Resolve(ctx, tenant, "API_KEY")
		require.NoError(t, err)
		require.Equal(t, st.want, r.Scope)
	}
	r, err := s.Resolve(ctx, tenant, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "from-user", string(r.Value))

	// Another user of the same workspace gets the workspace's; another
	// workspace gets the org's.
	r, err = s.Resolve(ctx, envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-7"}, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, ws, r.Scope)
	require.Equal(t, "from-ws", string(r.Value))
	r, err = s.Resolve(ctx, envelope.Tenant{OrgID: "acme", WorkspaceID: "sales"}, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, org, r.Scope)
	require.Equal(t, "org-again", string(r.Value))
	// Another org gets nothing.
	_, err = s.Resolve(ctx, envelope.Tenant{OrgID: "globex", WorkspaceID: "research", UserID: "u-42"}, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNotFound)

	// Locate needs no key and says where each name resolves.
	blind := open(t, env.JS, nil)
	require.False(t, blind.CanOpen())
	require.NoError(t, s.Set(ctx, org, "ONLY_ORG", []byte("xxxx")))
	loc, err := blind.Locate(ctx, tenant)
	require.NoError(t, err)
	require.Equal(t, map[string]secrets.Level{"API_KEY": secrets.LevelUser, "ONLY_ORG": secrets.LevelOrg}, loc)
	_, err = blind.Resolve(ctx, tenant, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNoKeyring)
	_, err = blind.Get(ctx, org, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrNoKeyring)
	require.ErrorIs(t, blind.Set(ctx, org, "X", []byte("xxxx")), secrets.ErrNoKeyring)
	infos, err := blind.List(ctx, org)
	require.NoError(t, err)
	require.Len(t, infos, 2)
}

func TestStoreIDsOfAnyShape(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := t.Context()
	sc, err := secrets.NewScope(secrets.LevelUser, odd.OrgID, "", odd.UserID)
	require.NoError(t, err)
	require.NoError(t, s.Set(ctx, sc, "TOKEN", []byte("odd-value")))
	r, err := s.Resolve(ctx, odd, "TOKEN")
	require.NoError(t, err)
	require.Equal(t, sc, r.Scope)
	require.Equal(t, "user Acme Inc./jane@acme.example", r.Scope.String())
}

// A sealed value is bound to its scope and name: copied to another key, it
// does not open; altered, it does not open.
func TestSealedValuesAreBoundToScopeAndName(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := t.Context()
	require.NoError(t, s.Set(ctx, org, "API_KEY", []byte("victim-value")))
	require.NoError(t, s.Set(ctx, secrets.OrgScope("evil"), "API_KEY", []byte("placeholder")))
	require.NoError(t, s.Set(ctx, org, "OTHER", []byte("placeholder")))

	kv, err := env.JS.KeyValue(ctx, provision.BucketSecrets)
	require.NoError(t, err)
	// The KV key of an org secret: "org.<base64url org id>.<name>".
	keyOf := func(scope secrets.Scope, name string) string { return "org." + encID(scope.OrgID) + "." + name }
	victim, err := kv.Get(ctx, keyOf(org, "API_KEY"))
	require.NoError(t, err)

	// Moved to another org, and to another name.
	_, err = kv.Put(ctx, keyOf(secrets.OrgScope("evil"), "API_KEY"), victim.Value())
	require.NoError(t, err)
	_, err = s.Get(ctx, secrets.OrgScope("evil"), "API_KEY")
	require.ErrorIs(t, err, secrets.ErrTampered)
	_, err = kv.Put(ctx, keyOf(org, "OTHER"), victim.Value())
	require.NoError(t, err)
	_, err = s.Get(ctx, org, "OTHER")
	require.ErrorIs(t, err, secrets.ErrTampered)

	// Altered, or not a sealed record at all.
	_, err = kv.Put(ctx, keyOf(org, "API_KEY"), []byte(`{"v":1,"key_id":"k1","nonce":"AAAAAAAAAAAAAAAA","ciphertext":"AAAA"}`))
	require.NoError(t, err)
	_, err = s.Get(ctx, org, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrTampered)
	_, err = kv.Put(ctx, keyOf(org, "API_KEY"), []byte(`not json`))
	require.NoError(t, err)
	_, err = s.Get(ctx, org, "API_KEY")
	require.ErrorIs(t, err, secrets.ErrTampered)
}

func TestRotation(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	old := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	require.NoError(t, old.Set(ctx, org, "A", []byte("value-a")))
	require.NoError(t, old.Set(ctx, ws, "B", []byte("value-b")))

	// A new key for new writes; the old one still opens what it sealed.
	both := open(t, env.JS, keyring(t, "k1:"+b64key('a')+",k2:"+b64key('b'), "k2"))
	require.NoError(t, both.Set(ctx, user, "C", []byte("value-c")))
	for _, c := range []struct {
		scope       secrets.Scope
		name, value string
	}{{org, "A", "value-a"}, {ws, "B", "value-b"}, {user, "C", "value-c"}} {
		v, err := both.Get(ctx, c.scope, c.name)
		require.NoError(t, err)
		require.Equal(t, c.value, string(v))
	}
	// Without k2, C cannot be opened: the error says why.
	_, err := old.Get(ctx, user, "C")
	require.ErrorIs(t, err, secrets.ErrUnknownKey)
	require.ErrorContains(t, err, `key id "k2"`)

	n, err := both.Reseal(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "A and B were under k1")
	n, err = both.Reseal(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "resealing again changes nothing")

	// k1 can now be retired.
	onlyNew := open(t, env.JS, keyring(t, "k2:"+b64key('b'), ""))
	for _, c := range []struct {
		scope secrets.Scope
		name  string
	}{{org, "A"}, {ws, "B"}, {user, "C"}} {
		_, err := onlyNew.Get(ctx, c.scope, c.name)
		require.NoError(t, err)
	}
	infos, err := onlyNew.List(ctx, org)
	require.NoError(t, err)
	require.Equal(t, "k2", infos[0].KeyID)
}

func TestStoreRejectsBadInput(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := context.Background()
	tests := []struct {
		name  string
		scope secrets.Scope
		key   string
		value string
		err   string
	}{
		{"bad name", org, "API-KEY", "value", `secret name "API-KEY" must be 1-64 letters`},
		{"short value", org, "K", "abc", "value of 3 bytes; want 4 to 65536"},
		{"workspace without workspace", secrets.Scope{Level: secrets.LevelWorkspace, OrgID: "acme"}, "K", "value",
			"workspace scope needs a workspace id"},
		{"org with a user", secrets.Scope{Level: secrets.LevelOrg, OrgID: "acme", UserID: "u"}, "K", "value",
			"org scope takes no user id"},
		{"no org", secrets.Scope{Level: secrets.LevelUser, UserID: "u"}, "K", "value", "user scope needs a org id"},
		{"unknown level", secrets.Scope{Level: "team", OrgID: "acme"}, "K", "value", `scope level "team" is not one of user, workspace, org`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Set(ctx, tt.scope, tt.key, []byte(tt.value))
			require.ErrorIs(t, err, secrets.ErrInvalid)
			require.ErrorContains(t, err, tt.err)
		})
	}
	err := s.Set(ctx, org, "BIG", make([]byte, secrets.MaxValueSize+1))
	require.ErrorIs(t, err, secrets.ErrInvalid)
	_, err = secrets.ParseLevel("team")
	require.ErrorContains(t, err, `scope "team" is not one of user, workspace, org`)
	l, err := secrets.ParseLevel("workspace")
	require.NoError(t, err)
	require.Equal(t, secrets.LevelWorkspace, l)
}

// TestNamesBucketHoldsTheKeysOnly: every secret set is named in the names
// bucket with no value, and its name goes with it; Locate reads only that
// bucket (a secret stored without its name, as before the bucket existed, is
// not located until Reindex names it); Reindex also drops a name of no
// secret, and changes nothing the second time.
func TestNamesBucketHoldsTheKeysOnly(t *testing.T) {
	env := eventstest.Start(t)
	s := open(t, env.JS, keyring(t, "k1:"+b64key('a'), ""))
	ctx := t.Context()
	tenant := envelope.Tenant{OrgID: "acme", WorkspaceID: "research"}
	names, err := env.JS.KeyValue(ctx, provision.BucketSecretNames)
	require.NoError(t, err)
	sealed, err := env.JS.KeyValue(ctx, provision.BucketSecrets)
	require.NoError(t, err)

	require.NoError(t, s.Set(ctx, ws, "API_KEY", []byte("ws-value")))
	require.NoError(t, s.Set(ctx, org, "OTHER", []byte("other-value")))
	keys := func(kv jetstream.KeyValue) []string {
		l, err := kv.ListKeys(ctx)
		require.NoError(t, err)
		var out []string
		for k := range l.Keys() {
			out = append(out, k)
		}
		return out
	}
	require.ElementsMatch(t, keys(sealed), keys(names), "the same keys in both buckets")
	for _, k := range keys(names) {
		e, err := names.Get(ctx, k)
		require.NoError(t, err)
		require.NotContains(t, string(e.Value()), "value", "a name holds no value")
		require.LessOrEqual(t, len(e.Value()), 1)
	}
	loc, err := s.Locate(ctx, tenant)
	require.NoError(t, err)
	require.Equal(t, map[string]secrets.Level{"API_KEY": secrets.LevelWorkspace, "OTHER": secrets.LevelOrg}, loc)

	require.NoError(t, s.Delete(ctx, org, "OTHER"))
	require.ElementsMatch(t, keys(sealed), keys(names), "a deleted secret's name goes too")

	// A secret stored without its name (before the names bucket), and a
	// name left of a secret gone.
	k, err := names.Get(ctx, keys(names)[0])
	require.NoError(t, err)
	e, err := sealed.Get(ctx, k.Key())
	require.NoError(t, err)
	old := strings.Replace(k.Key(), "API_KEY", "OLD_KEY", 1)
	_, err = sealed.Put(ctx, old, e.Value())
	require.NoError(t, err)
	_, err = names.Put(ctx, strings.Replace(k.Key(), "API_KEY", "GONE_KEY", 1), []byte("1"))
	require.NoError(t, err)
	loc, err = s.Locate(ctx, tenant)
	require.NoError(t, err)
	require.NotContains(t, loc, "OLD_KEY", "Locate reads the names only")
	require.Contains(t, loc, "GONE_KEY")

	n, err := s.Reindex(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.ElementsMatch(t, keys(sealed), keys(names))
	loc, err = s.Locate(ctx, tenant)
	require.NoError(t, err)
	require.Equal(t, map[string]secrets.Level{"API_KEY": secrets.LevelWorkspace, "OLD_KEY": secrets.LevelWorkspace}, loc)
	n, err = s.Reindex(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to change")
}
