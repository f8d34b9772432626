package secrets_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

func b64key(fill byte) string {
	return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(fill), secrets.KeySize)))
}

func TestParseKeyring(t *testing.T) {
	tests := []struct {
		name, keys, current string
		wantIDs             []string
		wantCurrent         string
		err                 string
	}{
		{name: "one key, no current", keys: "k1:" + b64key('a'), wantIDs: []string{"k1"}, wantCurrent: "k1"},
		{name: "two keys", keys: "k1:" + b64key('a') + ", k2:" + b64key('b'), current: "k2",
			wantIDs: []string{"k1", "k2"}, wantCurrent: "k2"},
		{name: "trailing comma", keys: "k1:" + b64key('a') + ",", wantIDs: []string{"k1"}, wantCurrent: "k1"},
		{name: "two keys, no current", keys: "k1:" + b64key('a') + ",k2:" + b64key('b'),
			err: "TOOLWIRE_MASTER_KEYS: keyring: 2 keys and no current one: set TOOLWIRE_MASTER_KEY_ID"},
		{name: "current not among them", keys: "k1:" + b64key('a'), current: "k9",
			err: `keyring: current key "k9" is not among the keys (k1)`},
		{name: "no colon", keys: b64key('a'), err: "TOOLWIRE_MASTER_KEYS: entry 1 is not id:base64key"},
		{name: "not base64", keys: "k1:###", err: `TOOLWIRE_MASTER_KEYS: key "k1" is not standard base64`},
		{name: "short key", keys: "k1:" + base64.StdEncoding.EncodeToString([]byte("short")),
			err: `keyring: key "k1" is 5 bytes; want 32 (AES-256)`},
		{name: "bad id", keys: "k 1:" + b64key('a'), err: `keyring: key id "k 1" must be 1-32 letters`},
		{name: "id twice", keys: "k1:" + b64key('a') + ",k1:" + b64key('b'), err: `key id "k1" is given twice`},
		{name: "empty", keys: " , ", err: "TOOLWIRE_MASTER_KEYS holds no key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := secrets.ParseKeyring(tt.keys, tt.current)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				require.NotContains(t, err.Error(), b64key('a'), "an error never shows a key")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantIDs, k.IDs())
			require.Equal(t, tt.wantCurrent, k.CurrentID())
		})
	}
}

func TestKeyringFromEnv(t *testing.T) {
	k, err := secrets.KeyringFromEnv(func(string) string { return "" })
	require.NoError(t, err)
	require.Nil(t, k, "no keys configured is not an error")
	k, err = secrets.KeyringFromEnv(nil)
	require.NoError(t, err)
	require.Nil(t, k)

	env := map[string]string{secrets.EnvMasterKeys: "old:" + b64key('a') + ",new:" + b64key('b'), secrets.EnvMasterKeyID: "new"}
	k, err = secrets.KeyringFromEnv(func(n string) string { return env[n] })
	require.NoError(t, err)
	require.Equal(t, "new", k.CurrentID())
}

func TestGenerateKey(t *testing.T) {
	a, err := secrets.GenerateKey("k2")
	require.NoError(t, err)
	b, err := secrets.GenerateKey("k2")
	require.NoError(t, err)
	require.NotEqual(t, a, b, "keys are random")
	k, err := secrets.ParseKeyring(a, "")
	require.NoError(t, err, "a generated key is what TOOLWIRE_MASTER_KEYS takes")
	require.Equal(t, "k2", k.CurrentID())
	_, err = secrets.GenerateKey("bad id")
	require.ErrorContains(t, err, `key id "bad id"`)
}

func FuzzParseKeyring(f *testing.F) {
	f.Add("k1:"+b64key('a'), "")
	f.Add("k1:"+b64key('a')+",k2:"+b64key('b'), "k2")
	f.Add("k1:", "k1")
	f.Add(":::", "")
	f.Fuzz(func(t *testing.T, keys, current string) {
		k, err := secrets.ParseKeyring(keys, current)
		if err != nil {
			require.Nil(t, k)
			return
		}
		require.Contains(t, k.IDs(), k.CurrentID())
	})
}
