package web

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// received is one request a test server saw: the host it was sent to and
// the secret-carrying headers it had.
type received struct {
	host, auth, key string
}

// recorder is a test server that keeps every request it receives.
type recorder struct {
	*counted
	mu  sync.Mutex
	got []received
}

func newRecorder(t *testing.T, h http.HandlerFunc) *recorder {
	t.Helper()
	r := &recorder{}
	r.counted = newCounted(t, func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, received{host: req.Host, auth: req.Header.Get("Authorization"), key: req.Header.Get("X-Api-Key")})
		r.mu.Unlock()
		h(w, req)
	})
	return r
}

func (r *recorder) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// TestSecretDestinations is the binding of a web tool's secrets: the model
// writes the call, so it names the URL and the header, but a declared secret
// goes only to the hosts and in the headers the tool's definition binds it
// to. Every other destination (another host, a lookalike, another scheme or
// port, another header, a secret without a binding) is POLICY_DENIED before
// anything is sent, and a redirect elsewhere goes on without the secret.
func TestSecretDestinations(t *testing.T) {
	const token = "tok-5ecret-d3stination"
	const otherToken = "other-s3cret-value"
	// api is the bound destination; it redirects when asked.
	api := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"host": r.Host})
	})
	// elsewhere is another port of the same address.
	elsewhere := newRecorder(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("elsewhere")) })
	_, apiPort, err := net.SplitHostPort(api.hostPort())
	require.NoError(t, err)
	_, elsewherePort, err := net.SplitHostPort(elsewhere.hostPort())
	require.NoError(t, err)

	// Every name resolves to the test servers' address, and the SSRF guard
	// lets both ports through: only the binding stands between a call and
	// the secret's delivery.
	names := testResolver{}
	for _, n := range []string{"api.example.test", "evil.example.test", "api.example.test.evil.test", "evilapi.example.test", "evil.test", "xn--pi-6kc.example.test"} {
		names[n] = addrs("127.0.0.1")
	}
	web := newTestClient(t, Config{AllowHosts: []string{api.hostPort(), elsewhere.hostPort()}, Resolver: names})
	bound := "http://api.example.test:" + apiPort
	tc := toolapi.Context{
		Auth: map[string]string{"API_TOKEN": token, "OTHER": otherToken},
		SecretDestinations: map[string]envelope.SecretBinding{
			"API_TOKEN": {Hosts: []string{bound}, Headers: []string{"Authorization"}},
		},
	}
	bearer := map[string]any{"Authorization": "Bearer {{secret:API_TOKEN}}"}
	allowedTo := "it may go only to " + bound + " (header Authorization)"

	tests := []struct {
		name    string
		url     string
		headers map[string]any // secret_headers; bearer when nil
		code    envelope.ErrorCode
		msg     string // in the refusal
		sent    bool   // the bound server received the secret
	}{
		{name: "the bound host sends the secret", url: bound + "/", sent: true},
		{name: "the bound host in capitals with a trailing dot", url: "http://API.Example.TEST.:" + apiPort + "/", sent: true},
		{name: "the bound host in full-width letters (dialled as api.example.test, named otherwise in the Host header)", url: "http://ａｐｉ.example.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "secret API_TOKEN may not be sent to http://ａｐｉ.example.test:" + apiPort + " (header Authorization)"},
		{name: "another host", url: "http://evil.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "secret API_TOKEN may not be sent to http://evil.test:" + apiPort + " (header Authorization): " + allowedTo},
		{name: "a sibling host", url: "http://evil.example.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://evil.example.test:" + apiPort},
		{name: "the bound host as a label of another", url: "http://api.example.test.evil.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://api.example.test.evil.test:" + apiPort},
		{name: "the bound host as a suffix", url: "http://evilapi.example.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://evilapi.example.test:" + apiPort},
		{name: "a Cyrillic lookalike", url: "http://аpi.example.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://xn--pi-6kc.example.test:" + apiPort},
		{name: "the bound host's address", url: "http://127.0.0.1:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://127.0.0.1:" + apiPort},
		{name: "the bound host's address in decimal", url: "http://2130706433:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://127.0.0.1:" + apiPort},
		{name: "another port", url: "http://api.example.test:" + elsewherePort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://api.example.test:" + elsewherePort},
		{name: "another scheme", url: "https://api.example.test:" + apiPort + "/",
			code: envelope.CodePolicyDenied, msg: "may not be sent to https://api.example.test:" + apiPort},
		{name: "the bound host as user info", url: "http://api.example.test:" + apiPort + "@evil.test:" + apiPort + "/",
			code: envelope.CodeValidation, msg: "credentials in the URL are not accepted"},
		{name: "the bound host after a backslash", url: `http://evil.test:` + apiPort + `\@api.example.test:` + apiPort + "/",
			code: envelope.CodeValidation, msg: "invalid userinfo"},
		{name: "the bound host in the fragment", url: "http://evil.test:" + apiPort + "#@api.example.test:" + apiPort,
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://evil.test:" + apiPort},
		{name: "the bound host in the query", url: "http://evil.test:" + apiPort + "/?@api.example.test:" + apiPort,
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://evil.test:" + apiPort},
		{name: "the bound host in the path", url: "http://evil.test:" + apiPort + "/" + bound,
			code: envelope.CodePolicyDenied, msg: "may not be sent to http://evil.test:" + apiPort},
		{name: "another header", url: bound + "/", headers: map[string]any{"X-Api-Key": "{{secret:API_TOKEN}}"},
			code: envelope.CodePolicyDenied, msg: "secret API_TOKEN may not be sent to " + bound + " (header X-Api-Key): " + allowedTo},
		{name: "the bound header beside another", url: bound + "/", headers: map[string]any{"Authorization": "Bearer {{secret:API_TOKEN}}", "X-Api-Key": "{{secret:API_TOKEN}}"},
			code: envelope.CodePolicyDenied, msg: "(header X-Api-Key)"},
		{name: "a secret without a binding", url: bound + "/", headers: map[string]any{"Authorization": "Bearer {{secret:OTHER}}"},
			code: envelope.CodePolicyDenied, msg: "secret OTHER may not be sent to " + bound + " (header Authorization): the tool's definition binds it to no destination"},
		{name: "a bound and an unbound secret in one header", url: bound + "/", headers: map[string]any{"Authorization": "{{secret:API_TOKEN}}:{{secret:OTHER}}"},
			code: envelope.CodePolicyDenied, msg: "secret OTHER may not be sent"},
	}
	for _, tl := range []httpTool{{web: web, getOnly: true, now: time.Now}, {web: web, now: time.Now}} {
		for _, tt := range tests {
			t.Run(tl.name()+"/"+tt.name, func(t *testing.T) {
				headers := tt.headers
				if headers == nil {
					headers = bearer
				}
				before := api.hits.Load() + elsewhere.hits.Load()
				out, te := runToolIn(t, tl, input(map[string]any{"url": tt.url, "secret_headers": headers}), tc)
				if !tt.sent {
					require.NotNil(t, te, "%s must be refused", tt.url)
					require.Equal(t, tt.code, te.Code, te.Message)
					require.Contains(t, te.Message, tt.msg)
					require.NotContains(t, te.Message, token)
					require.NotContains(t, te.Message, otherToken)
					require.Equal(t, before, api.hits.Load()+elsewhere.hits.Load(), "nothing was sent")
					return
				}
				require.Nil(t, te)
				require.EqualValues(t, 200, out["status"])
				got := api.requests()
				require.Equal(t, "Bearer "+token, got[len(got)-1].auth, "the bound server received the secret")
			})
		}
	}

	// Redirects: within the bound origin the secret follows; to anywhere
	// else the request goes on without it.
	redirects := []struct {
		name, to string
		keeps    bool
	}{
		{name: "to the same origin", to: "/landed", keeps: true},
		{name: "to another host", to: "http://evil.test:" + apiPort + "/landed"},
		{name: "to a lookalike host", to: "http://api.example.test.evil.test:" + apiPort + "/landed"},
		{name: "to the bound host's address", to: "http://127.0.0.1:" + apiPort + "/landed"},
		{name: "to another port", to: "http://api.example.test:" + elsewherePort + "/landed"},
	}
	for _, rd := range redirects {
		t.Run("redirect "+rd.name, func(t *testing.T) {
			n := len(api.requests())
			m := len(elsewhere.requests())
			_, te := runToolIn(t, httpTool{web: web, getOnly: true, now: time.Now},
				input(map[string]any{"url": bound + "/?to=" + url.QueryEscape(rd.to), "secret_headers": bearer}), tc)
			require.Nil(t, te)
			hops := append(api.requests()[n:], elsewhere.requests()[m:]...)
			require.Len(t, hops, 2, "the request and its redirect")
			require.Equal(t, "Bearer "+token, hops[0].auth, "the first request went to the bound host")
			if rd.keeps {
				require.Equal(t, "Bearer "+token, hops[1].auth)
				return
			}
			require.Empty(t, hops[1].auth, "the secret did not follow the redirect to %s", hops[1].host)
		})
	}

	// Whatever the calls asked, the secret only ever reached the bound
	// host, on its port.
	for _, r := range append(api.requests(), elsewhere.requests()...) {
		if strings.Contains(r.auth, token) {
			require.Contains(t, []string{"api.example.test:" + apiPort, "API.Example.TEST.:" + apiPort}, r.host)
		}
		require.NotContains(t, r.auth, otherToken, "the unbound secret went nowhere")
		require.NotContains(t, r.key, token)
	}
}

// TestSecretDestinationsOnRedirectHops: a hop that keeps a secret header is
// checked against the binding again before it is sent.
func TestSecretDestinationsOnRedirectHops(t *testing.T) {
	u, err := url.Parse("http://api.example.test/x")
	require.NoError(t, err)
	headers := []SecretHeader{{Name: "Authorization", Secrets: []string{"API_TOKEN"}}}
	bindings := map[string]envelope.SecretBinding{"API_TOKEN": {Hosts: []string{"http://api.example.test"}, Headers: []string{"Authorization"}}}
	require.NoError(t, checkSecretDestinations(u, headers, bindings))
	require.NoError(t, checkSecretDestinations(u, nil, nil), "a request without secret headers is not checked")

	for _, raw := range []string{"http://evil.test/", "https://api.example.test/", "http://api.example.test:8080/"} {
		hop, err := url.Parse(raw)
		require.NoError(t, err)
		err = checkSecretDestinations(hop, headers, bindings)
		var refused *SecretRefusedError
		require.ErrorAs(t, err, &refused, raw)
		require.Equal(t, "API_TOKEN", refused.Secret)
	}
	te := classifyTransportError(t.Context(), "http_get", u, &url.Error{Op: "Get", URL: u.String(), Err: &SecretRefusedError{Secret: "API_TOKEN", Destination: "http://evil.test:80", Header: "Authorization"}})
	require.Equal(t, envelope.CodePolicyDenied, te.(*envelope.ToolError).Code, "a refusal on a hop is POLICY_DENIED")
}

func TestOriginOf(t *testing.T) {
	tests := []struct {
		url  string
		want envelope.Origin
		err  string
	}{
		{url: "https://api.example.com/x", want: envelope.Origin{Scheme: "https", Host: "api.example.com", Port: "443"}},
		{url: "HTTP://API.Example.COM.:8080", want: envelope.Origin{Scheme: "http", Host: "api.example.com", Port: "8080"}},
		{url: "http://api.example.com:080", want: envelope.Origin{Scheme: "http", Host: "api.example.com", Port: "80"}},
		{url: "http://0x7f000001/", want: envelope.Origin{Scheme: "http", Host: "127.0.0.1", Port: "80"}},
		{url: "http://127.1/", want: envelope.Origin{Scheme: "http", Host: "127.0.0.1", Port: "80"}},
		{url: "https://[FD00:0::7]:8443/", want: envelope.Origin{Scheme: "https", Host: "fd00::7", Port: "8443"}},
		{url: "https://[::ffff:127.0.0.1]/", want: envelope.Origin{Scheme: "https", Host: "::ffff:127.0.0.1", Port: "443"}},
		{url: "https://bücher.example/", want: envelope.Origin{Scheme: "https", Host: "xn--bcher-kva.example", Port: "443"}},
		{url: "https://bücher.example./", want: envelope.Origin{Scheme: "https", Host: "xn--bcher-kva.example", Port: "443"}},
		{url: "https://BÜCHER.example/", err: `dialled as "xn--bcher-kva.example" but named "xn--BCHER-2pa.example" in the Host header`},
		{url: "https://ｅｘａｍｐｌｅ.com/", err: `dialled as "example.com" but named "xn--`},
		{url: "http://example.com../", err: "has an empty label"},
		{url: "http://a..example.com/", err: "has an empty label"},
		{url: "http://ν..example/", err: "has an empty label"},
		{url: "http://ν.\x98.example/", err: "not valid UTF-8"},
		{url: "ftp://example.com/", err: "is not http or https"},
		{url: "http://1.2.3.4.5/", err: "at most four parts"},
		{url: "http://a\u200d\u0301.example/", err: "not a valid internationalised name"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			require.NoError(t, err)
			o, err := OriginOf(u)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, o)
		})
	}
}

// TestEndpointBindings: an http tool's secrets are bound to its endpoint's
// scheme, host and port, in the headers its config sends them in.
func TestEndpointBindings(t *testing.T) {
	u, err := url.Parse("https://API.example.com./v1/weather")
	require.NoError(t, err)
	headers := []SecretHeader{
		{Name: "Authorization", Secrets: []string{"WEATHER_KEY"}},
		{Name: "X-Tenant-Key", Secrets: []string{"WEATHER_KEY", "TENANT"}},
	}
	b, err := EndpointBindings(u, headers)
	require.NoError(t, err)
	require.Equal(t, map[string]envelope.SecretBinding{
		"WEATHER_KEY": {Hosts: []string{"https://api.example.com:443"}, Headers: []string{"Authorization", "X-Tenant-Key"}},
		"TENANT":      {Hosts: []string{"https://api.example.com:443"}, Headers: []string{"X-Tenant-Key"}},
	}, b)
	require.NoError(t, checkSecretDestinations(u, headers, b))
	for _, raw := range []string{"https://api.example.com/other", "https://api.example.com:443/"} {
		other, err := url.Parse(raw)
		require.NoError(t, err)
		require.NoError(t, checkSecretDestinations(other, headers, b), raw)
	}
	for _, raw := range []string{"http://api.example.com/", "https://api.example.com:8443/", "https://example.com/"} {
		other, err := url.Parse(raw)
		require.NoError(t, err)
		require.Error(t, checkSecretDestinations(other, headers, b), raw)
	}
	require.Error(t, checkSecretDestinations(u, []SecretHeader{{Name: "X-Other", Secrets: []string{"TENANT"}}}, b), "another header")

	none, err := EndpointBindings(&url.URL{Scheme: "https", Host: "a..b"}, nil)
	require.NoError(t, err, "an endpoint that sends no secret needs no origin")
	require.Nil(t, none)
	_, err = EndpointBindings(&url.URL{Scheme: "https", Host: "a..b"}, headers)
	require.ErrorContains(t, err, "has an empty label")
}

// FuzzOriginOf: the origin of any URL a web tool accepts is normalised (no
// upper case, no trailing dot, a port), and a destination written from it
// is read back as the same origin: the call's side and the binding's side
// normalise alike.
func FuzzOriginOf(f *testing.F) {
	for _, s := range []string{
		"https://api.example.com/x", "HTTP://API.Example.COM.:080", "http://0x7f000001/", "https://[FD00:0::7]:8443/",
		"https://bücher.example./", "https://ｅｘａｍｐｌｅ.com/", "http://a.b.c.d.e/", "http://127.1:1", "https://xn--bcher-kva.example",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := CheckURL(s)
		if err != nil {
			return
		}
		o, err := OriginOf(u)
		if err != nil {
			return
		}
		require.Equal(t, strings.ToLower(o.Host), o.Host)
		require.False(t, strings.HasSuffix(o.Host, "."), "host %q", o.Host)
		require.NotEmpty(t, o.Port)
		d, err := envelope.ParseSecretDestination(o.String())
		if err != nil {
			return // a host a binding cannot name (an IPv4-mapped address, a character outside LDH and '_')
		}
		require.True(t, d.Matches(o), "%q: origin %v, destination %v", s, o, d)
	})
}
