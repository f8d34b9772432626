package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestParseSecretDestination(t *testing.T) {
	tests := []struct {
		in   string
		want envelope.SecretDestination
		str  string // its String; "" when the same as in
		err  string // "" when valid
	}{
		{in: "api.github.com", want: envelope.SecretDestination{Scheme: "https", Host: "api.github.com", Port: "443"}, str: "https://api.github.com"},
		{in: "https://api.github.com", want: envelope.SecretDestination{Scheme: "https", Host: "api.github.com", Port: "443"}},
		{in: "HTTPS://API.GitHub.COM./", want: envelope.SecretDestination{Scheme: "https", Host: "api.github.com", Port: "443"}, str: "https://api.github.com"},
		{in: "https://api.example.com:443", want: envelope.SecretDestination{Scheme: "https", Host: "api.example.com", Port: "443"}, str: "https://api.example.com"},
		{in: "https://api.example.com:08443", want: envelope.SecretDestination{Scheme: "https", Host: "api.example.com", Port: "8443"}, str: "https://api.example.com:8443"},
		{in: "http://internal:8080", want: envelope.SecretDestination{Scheme: "http", Host: "internal", Port: "8080"}},
		{in: "http://10.0.0.7", want: envelope.SecretDestination{Scheme: "http", Host: "10.0.0.7", Port: "80"}},
		{in: "[fd00::7]:8443", want: envelope.SecretDestination{Scheme: "https", Host: "fd00::7", Port: "8443"}, str: "https://[fd00::7]:8443"},
		{in: "https://[FD00:0::7]", want: envelope.SecretDestination{Scheme: "https", Host: "fd00::7", Port: "443"}, str: "https://[fd00::7]"},
		{in: "*.example.com", want: envelope.SecretDestination{Scheme: "https", Host: "example.com", Port: "443", Subdomains: true}, str: "https://*.example.com"},
		{in: "xn--bcher-kva.example", want: envelope.SecretDestination{Scheme: "https", Host: "xn--bcher-kva.example", Port: "443"}, str: "https://xn--bcher-kva.example"},

		{in: "", err: "no host"},
		{in: "https://", err: "no host"},
		{in: "ftp://example.com", err: "scheme must be http or https"},
		{in: "javascript://example.com", err: "scheme must be http or https"},
		{in: "https://example.com/path", err: "without a path"},
		{in: "https://example.com?x=1", err: "without a path, query"},
		{in: "https://example.com#f", err: "fragment"},
		{in: "https://user@example.com", err: "user info"},
		{in: "https://example.com@evil.net", err: "user info"},
		{in: `https://example.com\@evil.net`, err: "user info"},
		{in: "example .com", err: "space"},
		{in: "example.com:0", err: `port "0" is not a number from 1 to 65535`},
		{in: "example.com:65536", err: `port "65536"`},
		{in: "example.com:+443", err: `port "+443"`},
		{in: "example.com:", err: `port ""`},
		{in: "example.com:https", err: `port "https"`},
		{in: "*", err: "a wildcard is only *. before a domain"},
		{in: "*.com", err: "would match every name under a top-level domain"},
		{in: "*example.com", err: "a wildcard is only *. before a domain"},
		{in: "a.*.example.com", err: "a wildcard is only *. before a domain"},
		{in: "*.*.example.com", err: "a wildcard is only *. before a domain"},
		{in: "*.10.0.0.7", err: "*. goes before a domain name, not an IP address"},
		{in: "fd00::7", err: "write an IPv6 address in brackets"},
		{in: "[fd00::7", err: "without its closing ]"},
		{in: "[10.0.0.7]", err: "is not an IPv6 address"},
		{in: "[fe80::1%25eth0]", err: "an IP address with a zone"},
		{in: "[::ffff:127.0.0.1]", err: "IPv4-mapped"},
		{in: "2130706433", err: "not an IP address in its usual form"},
		{in: "0x7f.1", err: "not an IP address in its usual form"},
		{in: "bücher.example", err: "is not ASCII: write an internationalised name in its xn-- form"},
		{in: "ex!ample.com", err: "letters, digits, '_' and '-' only"},
		{in: "http://my_api.internal", want: envelope.SecretDestination{Scheme: "http", Host: "my_api.internal", Port: "80"}},
		{in: "-example.com", err: "neither starts nor ends with '-'"},
		{in: "example..com", err: "each label is 1 to 63 characters"},
		{in: strings.Repeat("a", 64) + ".com", err: "each label is 1 to 63 characters"},
		{in: strings.Repeat("abcdefg.", 32) + "com", err: "at most 253"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			d, err := envelope.ParseSecretDestination(tt.in)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, d)
			str := tt.str
			if str == "" {
				str = tt.in
			}
			require.Equal(t, str, d.String())
		})
	}
}

func TestSecretBindingAllows(t *testing.T) {
	b := envelope.SecretBinding{
		Hosts:   []string{"api.example.com", "http://10.0.0.7:8080", "*.uploads.example.com", "[fd00::7]"},
		Headers: []string{"authorization", "X-Api-Key"},
	}
	https := func(host string) envelope.Origin { return envelope.Origin{Scheme: "https", Host: host, Port: "443"} }
	tests := []struct {
		name   string
		origin envelope.Origin
		header string
		want   bool
	}{
		{"the host", https("api.example.com"), "Authorization", true},
		{"a header in another case", https("api.example.com"), "x-api-key", true},
		{"another header", https("api.example.com"), "X-Forwarded-Authorization", false},
		{"another host", https("evil.net"), "Authorization", false},
		{"a subdomain of the host", https("evil.api.example.com"), "Authorization", false},
		{"the parent domain", https("example.com"), "Authorization", false},
		{"the host as a label of another", https("api.example.com.evil.net"), "Authorization", false},
		{"the host as a prefix", https("api.example.community"), "Authorization", false},
		{"the host as a suffix", https("evilapi.example.com"), "Authorization", false},
		{"plain http", envelope.Origin{Scheme: "http", Host: "api.example.com", Port: "80"}, "Authorization", false},
		{"another port", envelope.Origin{Scheme: "https", Host: "api.example.com", Port: "8443"}, "Authorization", false},
		{"http on 443", envelope.Origin{Scheme: "http", Host: "api.example.com", Port: "443"}, "Authorization", false},
		{"an IP destination", envelope.Origin{Scheme: "http", Host: "10.0.0.7", Port: "8080"}, "Authorization", true},
		{"that IP on another port", envelope.Origin{Scheme: "http", Host: "10.0.0.7", Port: "80"}, "Authorization", false},
		{"another IP", envelope.Origin{Scheme: "http", Host: "10.0.0.8", Port: "8080"}, "Authorization", false},
		{"an IPv6 destination", https("fd00::7"), "Authorization", true},
		{"under a wildcard", https("a.uploads.example.com"), "Authorization", true},
		{"deeper under a wildcard", https("a.b.uploads.example.com"), "Authorization", true},
		{"the wildcard's domain itself", https("uploads.example.com"), "Authorization", false},
		{"an empty label under a wildcard", https(".uploads.example.com"), "Authorization", false},
		{"the wildcard's domain as a suffix", https("eviluploads.example.com"), "Authorization", false},
		{"no host", https(""), "Authorization", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, b.Allows(tt.origin, tt.header), "%s in %s", tt.origin, tt.header)
		})
	}
	require.Equal(t, "https://api.example.com, http://10.0.0.7:8080, https://*.uploads.example.com, https://[fd00::7] (headers Authorization, X-Api-Key)", b.Describe())
	require.False(t, envelope.SecretBinding{Hosts: []string{"ftp://x"}, Headers: []string{"A"}}.Allows(envelope.Origin{Scheme: "ftp", Host: "x"}, "A"), "an entry that does not parse allows nothing")
}

func TestToolDefinitionSecretDestinations(t *testing.T) {
	bind := func(hosts []string, headers ...string) envelope.SecretBinding {
		return envelope.SecretBinding{Hosts: hosts, Headers: headers}
	}
	tests := []struct {
		name    string
		kind    envelope.ImplementationKind
		secrets []string
		dests   map[string]envelope.SecretBinding
		err     string // "" when valid
		schema  bool   // the schema refuses it too
	}{
		{name: "none"},
		{name: "bound", secrets: []string{"TOKEN", "OTHER"}, dests: map[string]envelope.SecretBinding{
			"TOKEN": bind([]string{"api.example.com", "http://10.0.0.7:8080", "*.example.org"}, "Authorization"),
			"OTHER": bind([]string{"https://api.example.com:8443"}, "X-Api-Key", "Authorization"),
		}},
		{name: "a secret not required", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"OTHER": bind([]string{"api.example.com"}, "Authorization")},
			err: "secret_destinations.OTHER: the secret OTHER is not listed in required_secrets"},
		{name: "a bad secret name", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"bad-name": bind([]string{"api.example.com"}, "Authorization")},
			err: `secret_destinations.bad-name: secret name "bad-name"`, schema: true},
		{name: "no hosts", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind(nil, "Authorization")},
			err: "secret_destinations.TOKEN.hosts: name at least one destination", schema: true},
		{name: "no headers", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com"})},
			err: "secret_destinations.TOKEN.headers: name at least one header", schema: true},
		{name: "a bad host", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com", "https://example.com@evil.net"}, "Authorization")},
			err: `secret_destinations.TOKEN.hosts[1]: destination "https://example.com@evil.net": want [scheme://]host[:port], without a path, query, fragment, user info or space (found "@")`, schema: true},
		{name: "a URL with a path", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"https://api.example.com/v1"}, "Authorization")},
			err: "secret_destinations.TOKEN.hosts[0]", schema: true},
		{name: "a wildcard over a top-level domain", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"*.com"}, "Authorization")},
			err: "secret_destinations.TOKEN.hosts[0]: destination \"*.com\": *.com would match every name under a top-level domain"},
		{name: "the same destination twice", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com", "https://API.example.com:443"}, "Authorization")},
			err: "secret_destinations.TOKEN.hosts[1]: https://api.example.com is listed twice"},
		{name: "a bad header", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com"}, "Bad Header")},
			err: `secret_destinations.TOKEN.headers[0]: header name "Bad Header" is not a valid field name`, schema: true},
		{name: "a header the client sets", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com"}, "Host")},
			err: "secret_destinations.TOKEN.headers[0]: header Host is set by the client"},
		{name: "a header twice", secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com"}, "Authorization", "authorization")},
			err: "secret_destinations.TOKEN.headers[1]: header Authorization is listed twice"},
		{name: "an http tool", kind: envelope.ImplHTTP, secrets: []string{"TOKEN"}, dests: map[string]envelope.SecretBinding{"TOKEN": bind([]string{"api.example.com"}, "Authorization")},
			err: "secret_destinations: an http tool's secrets go to its implementation.config.url alone"},
	}
	schemas := newSchemas(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			d.Implementation = envelope.Implementation{Kind: envelope.ImplBuiltin}
			if tt.kind == envelope.ImplHTTP {
				d.Implementation = envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(
					`{"url":"https://api.example.com/","secret_headers":{"Authorization":"Bearer {{secret:TOKEN}}"}}`)}
			}
			d.RequiredSecrets, d.SecretDestinations = tt.secrets, tt.dests
			err := d.Validate()
			schemaErr := schemas.Validate(envelope.SchemaToolDefinition, marshal(t, d))
			if tt.err == "" {
				require.NoError(t, err)
				require.NoError(t, schemaErr, "the schema accepts what Validate accepts")
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, tt.err)
			if tt.schema {
				require.ErrorIs(t, schemaErr, envelope.ErrSchemaViolation, "the schema refuses it too")
			}
		})
	}

	// Absent when unset: definitions written before the field are unchanged.
	require.NotContains(t, string(marshal(t, fixtureToolDefinition())), "secret_destinations")
}

// FuzzParseSecretDestination: a destination that parses writes itself in a
// form that parses to the same destination, and never names a host with a
// character that would end a URL's authority.
func FuzzParseSecretDestination(f *testing.F) {
	for _, s := range []string{
		"api.github.com", "https://API.example.com.:0443/", "http://10.0.0.7:8080", "[fd00::7]:8443",
		"*.example.com", "https://example.com@evil.net", "xn--bcher-kva.example", "*.com", "0x7f.1",
		"[::ffff:127.0.0.1]", "example.com:", "https://", "a:b:c", "[fe80::1%eth0]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := envelope.ParseSecretDestination(s)
		if err != nil {
			return
		}
		require.Contains(t, []string{"http", "https"}, d.Scheme)
		require.NotEmpty(t, d.Host)
		require.NotEmpty(t, d.Port)
		require.False(t, strings.ContainsAny(d.Host, "/?#@\\ *[]\t\r\n"), "host %q", d.Host)
		again, err := envelope.ParseSecretDestination(d.String())
		require.NoError(t, err, "%q wrote %q", s, d.String())
		require.Equal(t, d, again)
		origin := envelope.Origin{Scheme: d.Scheme, Host: d.Host, Port: d.Port}
		require.Equal(t, !d.Subdomains, d.Matches(origin), "a destination matches its own origin unless it is a wildcard")
	})
}
