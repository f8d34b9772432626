package policy_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/policy/pii"
)

func TestSummarizeArgs(t *testing.T) {
	long := strings.Repeat("é", 100)
	tests := []struct{ name, in, want string }{
		{"plain", `{"to":"bob@example.com","subject":"Hi <3","n":2,"ok":true,"x":null}`,
			`{"n":2,"ok":true,"subject":"Hi <3","to":"[email]","x":null}`},
		{"personal data", `{"note":"call +1 415 555 2671 or mail jane@example.com","ssn":"123-45-6789","id":"078-05-1120","card":4111111111111111,"iban":"DE89 3704 0044 0532 0130 00","ip":"10.1.2.3","pin":1234,"cvv":123,"max_tokens":100,"count":7}`,
			`{"card":"[card]","count":7,"cvv":"[redacted]","iban":"[iban]","id":"[national_id]","ip":"[ip]","max_tokens":100,"note":"call [phone] or mail [email]","pin":"[redacted]","ssn":"[redacted]"}`},
		{"personal data before the cut", `{"body":"` + strings.Repeat("x", 70) + ` jane.doe@example.com"}`, `{"body":"` + strings.Repeat("x", 70) + ` [email]"}`},
		{"secret keys", `{"password":"hunter2","api_key":"k","Authorization":"x","auth":"y","x-auth-token":"z","author":"Jane","max_tokens":100,"otp":"123456","pin":"1234"}`,
			`{"Authorization":"[redacted]","api_key":"[redacted]","auth":"[redacted]","author":"Jane","max_tokens":100,"otp":"[redacted]","password":"[redacted]","pin":"[redacted]","x-auth-token":"[redacted]"}`},
		{"secret under a secret key is redacted whole", `{"credentials":{"user":"a","pass":"b"}}`, `{"credentials":"[redacted]"}`},
		{"credential-looking values", `{"h":"Bearer abc.def","k":"sk-proj-0123456789abcdef","g":"ghp_0123456789abcdefghijABCD","aws":"AKIAIOSFODNN7EXAMPLE","jwt":"eyJhbGciOi.eyJzdWIiOi.sig","pem":"-----BEGIN RSA PRIVATE KEY-----\nMII"}`,
			`{"aws":"[redacted]","g":"[redacted]","h":"[redacted]","jwt":"[redacted]","k":"[redacted]","pem":"[redacted]"}`},
		{"long string", `{"body":"` + long + `"}`, `{"body":"` + strings.Repeat("é", 80) + `…(+20 chars)"}`},
		{"long array", `[1,2,3,4,5,6,7,8,9,10,11,12]`, `[1,2,3,4,5,6,7,8,9,10,"…(+2 more)"]`},
		{"deep", `{"a":{"b":{"c":{"d":{"e":1}},"l":[[[[1]]]]}}}`, `{"a":{"b":{"c":{"d":"{…1 keys}"},"l":["[…1 items]"]}}}`},
		{"not JSON", `{"a":`, `(the arguments are not valid JSON: 5 bytes)`},
		{"a string", `"just text"`, `"just text"`},
		{"numbers keep their spelling", `{"n":1.50,"big":12345678901234567890}`, `{"big":12345678901234567890,"n":1.50}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policy.SummarizeArgs(json.RawMessage(tt.in))
			require.Equal(t, tt.want, got)
		})
	}

	// Per org: what the configuration says is stripped, only.
	none := policy.SummarizeArgsWith(json.RawMessage(`{"to":"bob@example.com","ip":"10.1.2.3"}`), pii.New([]pii.Kind{}...))
	require.Equal(t, `{"ip":"10.1.2.3","to":"bob@example.com"}`, none)
	ipOnly := policy.SummarizeArgsWith(json.RawMessage(`{"to":"bob@example.com","ip":"10.1.2.3"}`), pii.New(pii.IP))
	require.Equal(t, `{"ip":"[ip]","to":"bob@example.com"}`, ipOnly)

	many := map[string]int{}
	for i := range 30 {
		many[string(rune('a'+i%26))+strings.Repeat("k", i/26)] = i
	}
	b, err := json.Marshal(many)
	require.NoError(t, err)
	got := policy.SummarizeArgs(b)
	require.Contains(t, got, `"…":"(+10 more keys)"`)
	require.True(t, json.Valid([]byte(got)), got)

	// The whole summary is bounded.
	var huge []string
	for range 10 {
		huge = append(huge, strings.Repeat("x", 200))
	}
	nested := map[string]any{}
	for i := range 20 {
		nested[strings.Repeat("k", i+1)] = huge
	}
	b, err = json.Marshal(nested)
	require.NoError(t, err)
	got = policy.SummarizeArgs(b)
	require.LessOrEqual(t, len(got), 2000+len("…(+99999 bytes)"))
	require.Contains(t, got, "…(+")
}

func FuzzSummarizeArgs(f *testing.F) {
	f.Add([]byte(`{"password":"x","a":[1,2,{"b":"c"}]}`))
	f.Add([]byte(`"` + strings.Repeat("é", 90) + `"`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, in []byte) {
		got := policy.SummarizeArgs(in)
		require.LessOrEqual(t, len(got), 2100)
		if json.Valid(in) && len(got) <= 2000 && !strings.HasPrefix(got, "(") {
			require.True(t, json.Valid([]byte(got)), "a summary that was not cut is JSON: %q", got)
		}
	})
}
