package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// httpTool is a definition of kind http with config and secrets.
func httpTool(config string, secrets ...string) envelope.ToolDefinition {
	d := fixtureToolDefinition()
	d.Implementation = envelope.Implementation{Kind: envelope.ImplHTTP}
	if config != "" {
		d.Implementation.Config = json.RawMessage(config)
	}
	d.RequiredSecrets = secrets
	return d
}

func TestHTTPConfig(t *testing.T) {
	tests := []struct {
		name    string
		config  string
		secrets []string
		want    []string // fragments of Validate's error; none: valid
		// schema: the JSON Schema refuses it too (some rules, such as the
		// secrets a header names, are beyond a schema).
		schema bool
	}{
		{name: "a url", config: `{"url":"https://api.example.com/v1/weather"}`},
		{name: "loopback with a port, query and fragment", config: `{"url":"http://127.0.0.1:8080/hook?v=2#x"}`},
		{name: "PUT", config: `{"url":"https://api.example.com/items/1","method":"PUT"}`},
		{name: "headers and secret headers", secrets: []string{"API_KEY", "TENANT_TOKEN"},
			config: `{"url":"https://api.example.com/","headers":{"X-Api-Version":"2","Accept":"application/json"},
			  "secret_headers":{"Authorization":"Bearer {{secret:API_KEY}}","X-Tenant":"{{ secret:TENANT_TOKEN }}"}}`},

		{name: "no config", want: []string{`implementation.config: an http tool needs {"url": ...}`}, schema: true},
		{name: "null config", config: `null`, want: []string{`an http tool needs {"url": ...}`}, schema: true},
		{name: "no url", config: `{"method":"POST"}`, want: []string{`implementation.config: url "": scheme must be http or https`}, schema: true},
		{name: "not http", config: `{"url":"ftp://files.example.com/x"}`, want: []string{`url "ftp://files.example.com/x": scheme must be http or https`}, schema: true},
		{name: "file", config: `{"url":"file:///etc/passwd"}`, want: []string{"scheme must be http or https"}, schema: true},
		{name: "relative", config: `{"url":"/v1/weather"}`, want: []string{"scheme must be http or https"}, schema: true},
		{name: "no host", config: `{"url":"https:///v1"}`, want: []string{`url "https:///v1": no host`}, schema: true},
		{name: "user info", config: `{"url":"https://bob:hunter2@api.example.com/"}`,
			want: []string{`url "https://bob:xxxxx@api.example.com/": credentials in the URL are not accepted: use secret_headers`}, schema: true},
		{name: "bad port", config: `{"url":"http://api.example.com:99999/"}`, want: []string{`port "99999" is not a number from 1 to 65535`}},
		{name: "space in the host", config: `{"url":"http://api example.com/"}`, want: []string{`url "http://api example.com/": invalid character " " in host name`}, schema: true},
		{name: "an IPv6 address", config: `{"url":"http://[fd00::7]:8080/hook"}`},
		{name: "a name with digits", config: `{"url":"https://api2.example.com/"}`},
		{name: "five-part address", config: `{"url":"http://1.2.3.4.5/"}`,
			want: []string{`url "http://1.2.3.4.5/": host "1.2.3.4.5" is not a domain name, and not an IP address in its usual form`}},
		{name: "decimal address", config: `{"url":"http://2130706433/"}`, want: []string{`host "2130706433" is not a domain name`}},
		{name: "hex address", config: `{"url":"http://127.0x1/"}`, want: []string{`host "127.0x1" is not a domain name`}},
		{name: "mapped address", config: `{"url":"http://[::ffff:127.0.0.1]/"}`, want: []string{`host "::ffff:127.0.0.1" is not a domain name`}},
		{name: "unknown field", config: `{"url":"https://api.example.com/","timeout":5}`, want: []string{`implementation.config: json: unknown field "timeout"`}, schema: true},
		{name: "not an object", config: `"https://api.example.com/"`, want: []string{"implementation.config: json: cannot unmarshal string"}, schema: true},
		{name: "GET has no body", config: `{"url":"https://api.example.com/","method":"GET"}`, want: []string{`method "GET" is not one of POST, PUT, PATCH`}, schema: true},
		{name: "bad header name", config: `{"url":"https://a.example/","headers":{"X Bad":"1"}}`, want: []string{`headers: header name "X Bad" is not a valid field name`}, schema: true},
		{name: "hop header", config: `{"url":"https://a.example/","headers":{"host":"b.example"}}`, want: []string{"headers: header Host is set by the client and cannot be given"}},
		{name: "proxy header", config: `{"url":"https://a.example/","headers":{"Proxy-Authorization":"x"}}`, want: []string{"header Proxy-Authorization is set by the client"}},
		{name: "content type", config: `{"url":"https://a.example/","headers":{"content-type":"text/plain"}}`, want: []string{"headers: header Content-Type is set by the executor"}},
		{name: "idempotency key", config: `{"url":"https://a.example/","headers":{"Idempotency-Key":"fixed"}}`, want: []string{"header Idempotency-Key is set by the executor"}},
		{name: "line break", config: `{"url":"https://a.example/","headers":{"X-A":"1\r\nX-Evil: 2"}}`, want: []string{"header X-A holds a line break or NUL"}},
		{name: "control character", config: `{"url":"https://a.example/","headers":{"X-A":"a\u0007b"}}`, want: []string{"header X-A holds a control character"}},
		{name: "same header twice", secrets: []string{"K"}, config: `{"url":"https://a.example/","headers":{"x-key":"1"},"secret_headers":{"X-Key":"{{secret:K}}"}}`,
			want: []string{"secret_headers: header X-Key is given twice"}},
		{name: "secret in a plain header", secrets: []string{"K"}, config: `{"url":"https://a.example/","headers":{"Authorization":"Bearer {{secret:K}}"}}`,
			want: []string{"headers: header Authorization names a secret: put it in secret_headers", "required_secrets lists K, which no secret header sends"}},
		{name: "secret header without a secret", config: `{"url":"https://a.example/","secret_headers":{"Authorization":"Bearer abc"}}`,
			want: []string{"secret_headers: header Authorization names no {{secret:NAME}}; put plain values in headers"}, schema: true},
		{name: "secret not required", config: `{"url":"https://a.example/","secret_headers":{"Authorization":"Bearer {{secret:OTHER}}"}}`,
			want: []string{"secret_headers: header Authorization names the secret OTHER, which required_secrets does not list"}},
		{name: "required secret never sent", secrets: []string{"K", "UNUSED"}, config: `{"url":"https://a.example/","secret_headers":{"X-Key":"{{secret:K}}"}}`,
			want: []string{"required_secrets lists UNUSED, which no secret header sends: an http tool's secrets reach its endpoint only as headers"}},
		{name: "every problem at once", config: `{"url":"gopher://x","method":"DELETE","headers":{"Host":"y"}}`,
			want: []string{"scheme must be http or https", `method "DELETE"`, "header Host"}, schema: true},
	}
	schemas := newSchemas(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := httpTool(tc.config, tc.secrets...)
			err := d.Validate()
			schemaErr := schemas.ValidateValue(envelope.SchemaToolDefinition, d)
			if tc.want == nil {
				require.NoError(t, err)
				require.NoError(t, schemaErr, "the schema accepts what Validate accepts")
				c, err := d.HTTPConfig()
				require.NoError(t, err)
				require.NotEmpty(t, c.URL)
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), "hunter2", "a password in the URL is never repeated")
			if tc.schema {
				require.ErrorIs(t, schemaErr, envelope.ErrSchemaViolation, "the schema refuses it too")
			}
		})
	}
}

func TestHTTPConfigDecoded(t *testing.T) {
	d := httpTool(`{"url":"https://a.example/hook","headers":{"X-V":"2"},"secret_headers":{"Authorization":"Bearer {{secret:K}}"}}`, "K")
	c, err := d.HTTPConfig()
	require.NoError(t, err)
	require.Equal(t, envelope.HTTPConfig{
		URL: "https://a.example/hook", Headers: map[string]string{"X-V": "2"},
		SecretHeaders: map[string]string{"Authorization": "Bearer {{secret:K}}"},
	}, c)
	require.Equal(t, "POST", c.MethodOrDefault())
	c.Method = "PATCH"
	require.Equal(t, "PATCH", c.MethodOrDefault())

	other := fixtureToolDefinition()
	other.Implementation = envelope.Implementation{Kind: envelope.ImplBuiltin}
	_, err = other.HTTPConfig()
	require.ErrorContains(t, err, `implementation kind "builtin" is not http`)
}

func TestIdempotencyKey(t *testing.T) {
	a, err := envelope.CallID("send_email", "1.0.0", []byte(`{"to":"x@example.com"}`), 1)
	require.NoError(t, err)
	b, err := envelope.CallID("send_email", "1.0.0", []byte(`{ "to" : "x@example.com" }`), 1)
	require.NoError(t, err)
	require.Equal(t, a, b, "the same first call of two runs has one call_id")
	require.NotEqual(t, envelope.IdempotencyKey("run-1", a), envelope.IdempotencyKey("run-2", b), "but two keys")
	require.Equal(t, "run-1."+a, envelope.IdempotencyKey("run-1", a))
}

func TestCheckHTTPURL(t *testing.T) {
	u, err := envelope.CheckHTTPURL("HTTPS://Api.Example.com:8443/v1?q=1")
	require.NoError(t, err)
	require.Equal(t, "Api.Example.com", u.Hostname())
	_, err = envelope.CheckHTTPURL("https://" + strings.Repeat("a", 8200) + ".example/")
	require.ErrorContains(t, err, "url of 8217 bytes: at most 8192")
	_, err = envelope.CheckHTTPURL("http://[::1]:0/")
	require.ErrorContains(t, err, `port "0" is not a number from 1 to 65535`)
}

func TestCheckHeader(t *testing.T) {
	require.NoError(t, envelope.CheckHeader("X-Api-Version", "2"))
	require.NoError(t, envelope.CheckHeader("Accept", "text/html,\tapplication/json"), "a tab is allowed")
	for name, tc := range map[string]struct{ k, v, want string }{
		"empty name":  {"", "x", `header name "" is not a valid field name`},
		"colon":       {"X:A", "x", `header name "X:A"`},
		"hop":         {"transfer-encoding", "chunked", "header Transfer-Encoding is set by the client"},
		"NUL":         {"X-A", "a\x00b", "header X-A holds a line break or NUL"},
		"newline":     {"X-A", "a\nb", "holds a line break or NUL"},
		"DEL":         {"X-A", "a\x7fb", "header X-A holds a control character"},
		"long value":  {"X-A", strings.Repeat("v", 8193), "header X-A is 8193 bytes; at most 8192"},
		"long name":   {strings.Repeat("X", 257), "v", "is not a valid field name"},
		"proxy-*":     {"proxy-foo", "v", "header Proxy-Foo is set by the client"},
		"upgrade":     {"Upgrade", "h2c", "header Upgrade is set by the client"},
		"connection":  {"connection", "close", "header Connection is set by the client"},
		"host":        {"HOST", "x", "header Host is set by the client"},
		"te":          {"TE", "trailers", "header Te is set by the client"},
		"keep-alive":  {"Keep-Alive", "1", "header Keep-Alive is set by the client"},
		"content-len": {"Content-Length", "3", "header Content-Length is set by the client"},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorContains(t, envelope.CheckHeader(tc.k, tc.v), tc.want)
		})
	}
}

func TestSecretRefs(t *testing.T) {
	require.Equal(t, []string{"A", "b_2"}, envelope.SecretRefs("Bearer {{secret:A}} and {{ secret:b_2 }}"))
	require.Empty(t, envelope.SecretRefs("Bearer {{secret:1A}} {secret:A} {{ token:A }}"))

	values := map[string]string{"A": "alpha", "B": "beta"}
	lookup := func(n string) (string, bool) { v, ok := values[n]; return v, ok }
	got, missing := envelope.ExpandSecretRefs("{{secret:A}}:{{secret:B}}", lookup)
	require.Equal(t, "alpha:beta", got)
	require.Empty(t, missing)
	_, missing = envelope.ExpandSecretRefs("{{secret:A}} {{secret:C}} {{secret:D}}", lookup)
	require.Equal(t, "C", missing, "the first missing name")
}
