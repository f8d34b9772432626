package envelope

import (
	"fmt"
	"maps"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
)

// SecretBinding says where one secret a tool declares may be sent: the
// destinations (Hosts) and the request headers (Headers) that may carry it. A
// web tool (a version of http_request or http_get) sends a secret only in a
// request whose scheme, host and port one of Hosts names, in a header
// Headers names; anything else is refused with POLICY_DENIED before a byte
// is sent (docs/tools.md, Secrets by name). The binding comes from the tool
// definition, which an operator registers, never from a call's input, which
// the model writes.
//
//	"secret_destinations": {"GITHUB_TOKEN": {
//	  "hosts": ["api.github.com", "https://uploads.github.com:443"],
//	  "headers": ["Authorization"]}}
type SecretBinding struct {
	// Hosts are the destinations, each [scheme://]host[:port] (ParseSecretDestination).
	Hosts []string `json:"hosts"`
	// Headers are the names of the request headers that may carry the
	// secret, matched without regard to case.
	Headers []string `json:"headers"`
}

// Bounds of a secret binding.
const (
	maxSecretBindingHosts   = 16
	maxSecretBindingHeaders = 16
	maxDNSNameBytes         = 253
	maxDNSLabelBytes        = 63
)

// SecretDestination is one parsed entry of SecretBinding.Hosts: a scheme,
// a host and a port, or every name under a domain.
type SecretDestination struct {
	// Scheme is "https" (the default) or "http".
	Scheme string
	// Host is a lower-case ASCII domain name without a trailing dot, or an
	// IP address in its canonical form.
	Host string
	// Port is the port in decimal, the scheme's default when unwritten.
	Port string
	// Subdomains is true for an entry written *.Host: any name under Host
	// (a.Host, a.b.Host), not Host itself.
	Subdomains bool
}

// Origin is where a request goes, normalised as SecretDestination is: a
// lower-case scheme, a lower-case ASCII host without a trailing dot (or a
// canonical IP address), and a decimal port, the scheme's default when the
// URL names none. The executor's web tools build it from the URL they send
// to (services/executor/tools/web).
type Origin struct {
	Scheme string
	Host   string
	Port   string
}

// String writes the origin as a URL's scheme://host:port.
func (o Origin) String() string {
	return o.Scheme + "://" + joinHostPort(o.Host, o.Port)
}

// DefaultPort is the port of scheme http (80) or https (443); "" for any
// other scheme.
func DefaultPort(scheme string) string {
	switch scheme {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

// ParseSecretDestination reads one destination of a secret binding:
// [scheme://]host[:port]. The scheme is https unless written (http or
// https); the port is the scheme's default unless written; the host is a
// domain name in ASCII (an internationalised name in its xn-- form), an IP
// address in its usual form (10.0.0.7, [fd00::7]), or *.domain for every
// name under a domain of at least two labels. No path, query, fragment or
// user info.
func ParseSecretDestination(s string) (SecretDestination, error) {
	bad := func(format string, args ...any) (SecretDestination, error) {
		return SecretDestination{}, fmt.Errorf("destination %q: %s", truncateForError(s), fmt.Sprintf(format, args...))
	}
	d := SecretDestination{Scheme: "https"}
	rest := s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		d.Scheme = strings.ToLower(scheme)
		if d.Scheme != "http" && d.Scheme != "https" {
			return bad("scheme must be http or https")
		}
		rest = after
	}
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" {
		return bad("no host")
	}
	if i := strings.IndexAny(rest, "/?#@\\ \t"); i >= 0 {
		return bad("want [scheme://]host[:port], without a path, query, fragment, user info or space (found %q)", rest[i:i+1])
	}
	host, port := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return bad("an IPv6 address without its closing ]")
		}
		host, port = rest[1:end], rest[end+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return bad("want [IPv6]:port")
			}
			port = port[1:]
		}
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Is6() {
			return bad("%q in brackets is not an IPv6 address", truncateForError(host))
		}
	} else if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		host, port = rest[:i], rest[i+1:]
		if strings.Contains(host, ":") {
			return bad("write an IPv6 address in brackets ([fd00::7])")
		}
	}
	if port != "" || strings.HasSuffix(rest, ":") {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "+") {
			return bad("port %q is not a number from 1 to 65535", truncateForError(port))
		}
		d.Port = strconv.Itoa(n)
	} else {
		d.Port = DefaultPort(d.Scheme)
	}
	if base, ok := strings.CutPrefix(host, "*."); ok {
		d.Subdomains, host = true, base
	}
	if strings.Contains(host, "*") {
		return bad("a wildcard is only *. before a domain (*.example.com)")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		switch {
		case d.Subdomains:
			return bad("*. goes before a domain name, not an IP address")
		case ip.Zone() != "":
			return bad("an IP address with a zone")
		case ip.Is4In6():
			return bad("an IPv4-mapped IPv6 address: write the IPv4 address")
		}
		d.Host = ip.String()
		return d, nil
	}
	if err := checkEndpointHost(host); err != nil {
		return bad("%v", err)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if err := checkDNSName(name); err != nil {
		return bad("%v", err)
	}
	if d.Subdomains && !strings.Contains(name, ".") {
		return bad("*.%s would match every name under a top-level domain: name a domain of at least two labels", name)
	}
	d.Host = name
	return d, nil
}

// checkDNSName checks a lower-case host name: labels of 1 to 63 letters,
// digits, '_' (which internal names hold) and '-' (neither first nor last),
// at most 253 bytes in all.
func checkDNSName(name string) error {
	if name == "" {
		return fmt.Errorf("no host")
	}
	if len(name) > maxDNSNameBytes {
		return fmt.Errorf("a host name of %d bytes; at most %d", len(name), maxDNSNameBytes)
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > maxDNSLabelBytes {
			return fmt.Errorf("host %q: each label is 1 to %d characters", truncateForError(name), maxDNSLabelBytes)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: a label neither starts nor ends with '-'", truncateForError(name))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				if c >= 0x80 {
					return fmt.Errorf("host %q is not ASCII: write an internationalised name in its xn-- form", truncateForError(name))
				}
				return fmt.Errorf("host %q: a label holds letters, digits, '_' and '-' only", truncateForError(name))
			}
		}
	}
	return nil
}

// String writes the destination in the form ParseSecretDestination reads,
// with the scheme and without the scheme's default port.
func (d SecretDestination) String() string {
	h := d.Host
	if d.Subdomains {
		h = "*." + h
	}
	port := d.Port
	if port == DefaultPort(d.Scheme) {
		port = ""
	}
	return d.Scheme + "://" + joinHostPort(h, port)
}

// Matches reports whether a request to o goes to d: the same scheme and
// port, and the same host, or for *.domain a host that ends in .domain.
func (d SecretDestination) Matches(o Origin) bool {
	if o.Scheme != d.Scheme || o.Port != d.Port || o.Host == "" {
		return false
	}
	if !d.Subdomains {
		return o.Host == d.Host
	}
	sub, ok := strings.CutSuffix(o.Host, "."+d.Host)
	// An IP address never ends in a domain name's labels; a name under the
	// domain has a label of its own before it.
	return ok && sub != "" && !strings.HasSuffix(sub, ".")
}

// Allows reports whether the binding lets its secret go to o in the header
// named header. An entry of Hosts that does not parse allows nothing.
func (b SecretBinding) Allows(o Origin, header string) bool {
	ck := textproto.CanonicalMIMEHeaderKey(header)
	if !slices.ContainsFunc(b.Headers, func(h string) bool { return textproto.CanonicalMIMEHeaderKey(h) == ck }) {
		return false
	}
	for _, h := range b.Hosts {
		if d, err := ParseSecretDestination(h); err == nil && d.Matches(o) {
			return true
		}
	}
	return false
}

// Describe lists the binding's destinations and headers for a refusal's
// message: "https://api.github.com (header Authorization)".
func (b SecretBinding) Describe() string {
	var hosts []string
	for _, h := range b.Hosts {
		if d, err := ParseSecretDestination(h); err == nil {
			hosts = append(hosts, d.String())
		}
	}
	headers := make([]string, len(b.Headers))
	for i, h := range b.Headers {
		headers[i] = textproto.CanonicalMIMEHeaderKey(h)
	}
	return strings.Join(hosts, ", ") + " (" + plural(len(headers), "header", "headers") + " " + strings.Join(headers, ", ") + ")"
}

// secretBindingProblems checks a definition's secret_destinations: each
// names a secret of required_secrets, has 1 to 16 hosts that parse and 1 to
// 16 valid header names, none twice; an http tool has none (its secrets go
// to its url alone).
func secretBindingProblems(d *ToolDefinition) []string {
	if len(d.SecretDestinations) == 0 {
		return nil
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if d.Implementation.Kind == ImplHTTP {
		add("secret_destinations: an http tool's secrets go to its implementation.config.url alone; leave secret_destinations out")
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(d.SecretDestinations)) {
		b := d.SecretDestinations[name]
		at := "secret_destinations." + truncateForError(name)
		if err := ValidateSecretName(name); err != nil {
			add("%s: %v", at, err)
			continue
		}
		if !slices.Contains(d.RequiredSecrets, name) {
			add("%s: the secret %s is not listed in required_secrets", at, name)
		}
		switch n := len(b.Hosts); {
		case n == 0:
			add("%s.hosts: name at least one destination ([scheme://]host[:port])", at)
		case n > maxSecretBindingHosts:
			add("%s.hosts: %d destinations; at most %d", at, n, maxSecretBindingHosts)
		}
		seen := map[SecretDestination]bool{}
		for i, h := range b.Hosts {
			dest, err := ParseSecretDestination(h)
			switch {
			case err != nil:
				add("%s.hosts[%d]: %v", at, i, err)
			case seen[dest]:
				add("%s.hosts[%d]: %s is listed twice", at, i, dest)
			}
			seen[dest] = true
		}
		switch n := len(b.Headers); {
		case n == 0:
			add("%s.headers: name at least one header that may carry the secret (Authorization)", at)
		case n > maxSecretBindingHeaders:
			add("%s.headers: %d headers; at most %d", at, n, maxSecretBindingHeaders)
		}
		seenHeader := map[string]bool{}
		for i, h := range b.Headers {
			ck := textproto.CanonicalMIMEHeaderKey(h)
			switch err := CheckHeader(h, ""); {
			case err != nil:
				add("%s.headers[%d]: %v", at, i, err)
			case seenHeader[ck]:
				add("%s.headers[%d]: header %s is listed twice", at, i, ck)
			}
			seenHeader[ck] = true
		}
	}
	return out
}

// joinHostPort writes host:port, an IPv6 address in brackets, host alone
// when port is "".
func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == "" {
		return host
	}
	return host + ":" + port
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
