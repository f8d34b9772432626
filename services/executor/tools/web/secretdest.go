package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// This file binds secrets to their destinations (docs/tools.md, Secrets by
// name). A web tool's call names the URL and the secret headers, and the
// model writes the call: left to it, a prompt injection sends any declared
// secret anywhere. So a secret goes only where the registry entry's
// secret_destinations (envelope.SecretBinding) say, and an http tool's only
// to its endpoint: before the first byte of a request, and again on every
// redirect hop that keeps a secret header, the request's destination is
// normalised as the dialer will reach it (OriginOf) and checked against the
// binding of every secret in every secret header. A mismatch, or a secret
// without a binding, is POLICY_DENIED and nothing is sent.

// SecretHeader is a request header whose value holds secrets.
type SecretHeader struct {
	// Name is the header's name as the request sends it.
	Name string
	// Secrets name the secrets its value holds.
	Secrets []string
}

// SecretRefusedError refuses to send a secret to a destination, or in a
// header, that its binding does not name, or a secret that has no binding.
// It names the secret, the destination and the header, never the value.
// The tools report it as POLICY_DENIED: nothing was sent.
type SecretRefusedError struct {
	Secret string
	// Destination is where the request was going (OriginOf), or the URL's
	// host as written when it could not be normalised.
	Destination string
	Header      string
	// Allowed describes the binding (envelope.SecretBinding.Describe); ""
	// when the secret has none.
	Allowed string
}

func (e *SecretRefusedError) Error() string {
	if e.Allowed == "" {
		return fmt.Sprintf("secret %s may not be sent to %s (header %s): the tool's definition binds it to no destination "+
			"(secret_destinations names the hosts and headers a secret may go to)", e.Secret, e.Destination, e.Header)
	}
	return fmt.Sprintf("secret %s may not be sent to %s (header %s): it may go only to %s", e.Secret, e.Destination, e.Header, e.Allowed)
}

// OriginOf normalises the destination of a request to u as the client
// reaches it: the scheme in lower case; the host in lower case without a
// trailing dot, an internationalised name in its ASCII (xn--) form as
// net/http dials it (IDNA's lookup profile, which also folds full-width and
// other compatibility forms), an IP address in any spelling the guard reads
// (2130706433, 0x7f.1) in its canonical form; the port in decimal, the
// scheme's default when u names none.
func OriginOf(u *url.URL) (envelope.Origin, error) {
	o := envelope.Origin{Scheme: strings.ToLower(u.Scheme)}
	if o.Scheme != "http" && o.Scheme != "https" {
		return o, fmt.Errorf("url scheme %q is not http or https", u.Scheme)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return o, fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
		o.Port = strconv.Itoa(n)
	} else {
		o.Port = envelope.DefaultPort(o.Scheme)
	}
	host := u.Hostname()
	ip, isIP, err := parseHost(host)
	if err != nil {
		return o, err
	}
	if isIP {
		o.Host = ip.String()
		return o, nil
	}
	name := strings.TrimSuffix(host, ".")
	if name == "" || strings.HasPrefix(name, ".") || strings.Contains(name, "..") || strings.HasSuffix(name, ".") {
		return o, fmt.Errorf("host %q has an empty label", host)
	}
	if isASCII(name) {
		o.Host = strings.ToLower(name)
		return o, nil
	}
	if !utf8.ValidString(name) {
		return o, fmt.Errorf("host %q is not valid UTF-8", host)
	}
	dialled, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return o, fmt.Errorf("host %q is not a valid internationalised name: %w", host, err)
	}
	// net/http dials the name mapped (full-width, upper-case letters folded)
	// but writes it in the Host header unmapped: a name for which the two
	// differ names two servers, and goes nowhere a secret is bound to.
	named, err := idna.Punycode.ToASCII(name)
	if err != nil || !strings.EqualFold(dialled, named) {
		return o, fmt.Errorf("host %q is dialled as %q but named %q in the Host header: write it in lower case, or in ASCII", host, dialled, named)
	}
	o.Host = strings.ToLower(dialled)
	if strings.HasPrefix(o.Host, ".") || strings.Contains(o.Host, "..") || strings.HasSuffix(o.Host, ".") {
		return o, fmt.Errorf("host %q has an empty label", host)
	}
	return o, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// sameOrigin reports whether a and b go to the same scheme, host and port;
// false when either cannot be normalised.
func sameOrigin(a, b *url.URL) bool {
	oa, err := OriginOf(a)
	if err != nil {
		return false
	}
	ob, err := OriginOf(b)
	return err == nil && oa == ob
}

// checkSecretDestinations checks every secret of every header in headers
// against its binding for a request to u: nil when each may go there in
// its header, else a *SecretRefusedError for the first that may not (in
// the headers' order).
func checkSecretDestinations(u *url.URL, headers []SecretHeader, bindings map[string]envelope.SecretBinding) error {
	if len(headers) == 0 {
		return nil
	}
	o, oerr := OriginOf(u)
	dest := o.String()
	if oerr != nil {
		dest = u.Scheme + "://" + u.Host
	}
	for _, h := range headers {
		name := http.CanonicalHeaderKey(h.Name)
		for _, s := range h.Secrets {
			b, ok := bindings[s]
			if !ok {
				return &SecretRefusedError{Secret: s, Destination: dest, Header: name}
			}
			if oerr != nil || !b.Allows(o, name) {
				return &SecretRefusedError{Secret: s, Destination: dest, Header: name, Allowed: b.Describe()}
			}
		}
	}
	return nil
}

// EndpointBindings binds each secret of headers to u, the endpoint of an
// http tool, in the headers that carry it: an http tool's secrets go to
// its endpoint alone. An error says that u's destination cannot be
// normalised (OriginOf), so no secret may go there.
func EndpointBindings(u *url.URL, headers []SecretHeader) (map[string]envelope.SecretBinding, error) {
	if len(headers) == 0 {
		return nil, nil
	}
	o, err := OriginOf(u)
	if err != nil {
		return nil, err
	}
	out := map[string]envelope.SecretBinding{}
	for _, h := range headers {
		for _, s := range h.Secrets {
			b := out[s]
			if len(b.Hosts) == 0 {
				b.Hosts = []string{o.String()}
			}
			b.Headers = append(b.Headers, h.Name)
			out[s] = b
		}
	}
	return out, nil
}
