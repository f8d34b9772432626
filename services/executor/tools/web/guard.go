package web

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"code.dny.dev/ssrf"
)

// This file guards the web tools (http_request, http_get, web_fetch) against
// server-side request forgery. The check happens when a connection is dialled,
// after DNS resolution: whatever the URL said, and whichever redirect led
// there, the executor connects only to addresses that passed the check.
//
// The classification of addresses is code.dny.dev/ssrf's: it is generated
// from the IANA special-purpose registries for IPv4 and IPv6 and refuses every
// IPv6 address outside global unicast (2000::/3), which covers loopback,
// unspecified, link-local, unique-local (fc00::/7, hence fd00:ec2::254),
// multicast, IPv4-mapped (::ffff:0:0/96) and NAT64 addresses in one rule.
// This file adds what a dialer cannot see: the spelling of the host (IPv4 in
// decimal, octal, hex or shortened forms is read the way a browser reads it,
// so "http://2130706433/" is 127.0.0.1 and refused as such), the operator's
// allow-list, and an error that names the reason in words.

// Well-known addresses that deserve their own words in a refusal.
var (
	metadataV4 = netip.MustParseAddr("169.254.169.254")
	metadataV6 = netip.MustParseAddr("fd00:ec2::254")
	broadcast  = netip.MustParseAddr("255.255.255.255")
	cgnat      = netip.MustParsePrefix("100.64.0.0/10")
)

// DestinationRefusedError is a web tool's refusal to connect to an address
// that the SSRF guard does not permit. The executor reports it as
// POLICY_DENIED: nothing was sent.
type DestinationRefusedError struct {
	// Host is the host as the request named it ("localhost", "2130706433").
	Host string
	// Addr is the address it resolved to.
	Addr netip.Addr
	// Reason says what kind of address it is ("a loopback address").
	Reason string
}

func (e *DestinationRefusedError) Error() string {
	dest := e.Addr.String()
	if e.Host != "" && e.Host != dest {
		dest = e.Host + " (" + dest + ")"
	}
	return fmt.Sprintf("destination %s is %s: refused (allow it with %s)", dest, e.Reason, EnvAllowHosts)
}

// invalidHostError is a host that is neither a domain name nor an IP address
// (for example "1.2.3.4.5", or "foo.0x1g" whose last label looks numeric).
type invalidHostError struct{ host, why string }

func (e *invalidHostError) Error() string {
	return fmt.Sprintf("host %q is not a valid host name or IP address: %s", e.host, e.why)
}

// describeAddr says in words what kind of refused address ip is.
func describeAddr(ip netip.Addr) string {
	if ip.Is4In6() {
		inner := ip.Unmap()
		if kind := specialKind(inner); kind != "" {
			return "an IPv4-mapped IPv6 address (of " + inner.String() + ", " + kind + ")"
		}
		return "an IPv4-mapped IPv6 address (of " + inner.String() + ")"
	}
	if kind := specialKind(ip); kind != "" {
		return kind
	}
	return "a special-purpose address"
}

// specialKind names the well-known kinds of special addresses; "" for others.
func specialKind(ip netip.Addr) string {
	switch {
	case ip == metadataV4 || ip == metadataV6:
		return "the cloud metadata address"
	case ip.Zone() != "":
		return "an address with a zone"
	case ip.IsUnspecified():
		return "an unspecified address"
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsPrivate():
		return "a private address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	case ip.IsMulticast():
		return "a multicast address"
	case ip == broadcast:
		return "the broadcast address"
	case cgnat.Contains(ip):
		return "a carrier-grade NAT (shared) address"
	case ip.Is4() && ip.As4()[0] == 0:
		return `a "this network" address`
	}
	return ""
}

// hostPort is one entry of the allow-list: a host (a lower-case name or a
// canonical IP address) and, optionally, a port ("" for any).
type hostPort struct {
	host string
	ip   netip.Addr // valid when host is an IP address
	port string
}

// parseAllowHosts reads a comma-separated list of host[:port] entries
// (IPv6 addresses in brackets when a port follows).
func parseAllowHosts(s string) ([]hostPort, error) {
	var out []hostPort
	var errs []error
	for raw := range strings.SplitSeq(s, ",") {
		e := strings.TrimSpace(raw)
		if e == "" {
			continue
		}
		hp, err := parseAllowEntry(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, hp)
	}
	return out, errors.Join(errs...)
}

func parseAllowEntry(e string) (hostPort, error) {
	host, port := e, ""
	if h, p, err := net.SplitHostPort(e); err == nil {
		host, port = h, p
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return hostPort{}, fmt.Errorf("allow-list entry %q: port %q is not a number from 1 to 65535", e, p)
		}
	} else if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
		host = e[1 : len(e)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" || strings.ContainsAny(host, "/@?#* \t") {
		return hostPort{}, fmt.Errorf("allow-list entry %q: want host or host:port", e)
	}
	hp := hostPort{host: host, port: port}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return hostPort{}, fmt.Errorf("allow-list entry %q: addresses with a zone are not supported", e)
		}
		hp.ip, hp.host = ip, ip.String()
	} else if _, isIP, err := parseHost(host); err != nil || isIP {
		return hostPort{}, fmt.Errorf("allow-list entry %q: write IP addresses in their usual form (127.0.0.1, [::1])", e)
	}
	return hp, nil
}

// allowList is the set of destinations an operator trusts beyond the guard.
type allowList []hostPort

// allows reports whether the list holds host (a name as the request gave it,
// or an address) on port.
func (l allowList) allows(host string, ip netip.Addr, port string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, e := range l {
		if e.port != "" && e.port != port {
			continue
		}
		if e.ip.IsValid() {
			if ip.IsValid() && e.ip == ip {
				return true
			}
			continue
		}
		if host != "" && e.host == host {
			return true
		}
	}
	return false
}

// String lists the entries as they are matched.
func (l allowList) String() string {
	parts := make([]string, len(l))
	for i, e := range l {
		h := e.host
		if e.ip.Is6() {
			h = "[" + h + "]"
		}
		if e.port != "" {
			h += ":" + e.port
		}
		parts[i] = h
	}
	return strings.Join(parts, ",")
}

// parseHost reads a URL host (without brackets or port). It returns the
// address when the host is an IP address in any spelling a browser accepts
// (the WHATWG URL standard's IPv4 parser: "2130706433", "0x7f000001",
// "0177.0.0.1", "127.1"), or isIP false for a domain name.
func parseHost(host string) (ip netip.Addr, isIP bool, err error) {
	if host == "" {
		return netip.Addr{}, false, &invalidHostError{host: host, why: "it is empty"}
	}
	if strings.Contains(host, ":") {
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return netip.Addr{}, false, &invalidHostError{host: host, why: "not an IPv6 address"}
		}
		return ip, true, nil
	}
	if !endsInNumber(host) {
		return netip.Addr{}, false, nil
	}
	v4, err := parseWHATWGIPv4(host)
	if err != nil {
		return netip.Addr{}, false, &invalidHostError{host: host, why: err.Error()}
	}
	return v4, true, nil
}

// endsInNumber is the URL standard's "ends in a number" checker: the last
// label (ignoring one trailing dot) is all digits or a 0x number, which makes
// the whole host an IPv4 address.
func endsInNumber(host string) bool {
	parts := strings.Split(host, ".")
	if parts[len(parts)-1] == "" {
		if len(parts) == 1 {
			return false
		}
		parts = parts[:len(parts)-1]
	}
	last := parts[len(parts)-1]
	if last != "" && strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, err := parseIPv4Number(last)
	return err == nil
}

// parseWHATWGIPv4 is the URL standard's IPv4 parser.
func parseWHATWGIPv4(host string) (netip.Addr, error) {
	parts := strings.Split(host, ".")
	if parts[len(parts)-1] == "" && len(parts) > 1 {
		parts = parts[:len(parts)-1]
	}
	if len(parts) > 4 {
		return netip.Addr{}, errors.New("an IPv4 address has at most four parts")
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, err := parseIPv4Number(p)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("part %q: %w", p, err)
		}
		nums[i] = n
	}
	for _, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, errors.New("a part of an IPv4 address is larger than 255")
		}
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, errors.New("the IPv4 address is out of range")
	}
	v := last
	for i, n := range nums[:len(nums)-1] {
		v += n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
}

// parseIPv4Number reads one part of an IPv4 address: decimal, octal with a
// leading 0, or hex with 0x.
func parseIPv4Number(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty part")
	}
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, errors.New("number out of range")
		}
		return 0, fmt.Errorf("not a base-%d number", base)
	}
	return n, nil
}

// HostResolver resolves host names; *net.Resolver is one.
type HostResolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// guardedDialer dials only addresses that the guard permits or that the
// operator's allow-list names.
type guardedDialer struct {
	guard    *ssrf.Guardian
	allow    allowList
	resolver HostResolver
	timeout  time.Duration
	// connects counts the connections attempted (sockets that passed the
	// Control hook): what a refusal must leave unchanged.
	connects atomic.Int64
}

func newGuardedDialer(allow allowList, resolver HostResolver, timeout time.Duration) *guardedDialer {
	if resolver == nil {
		resolver = &net.Resolver{}
	}
	// Any port: a public API may listen anywhere; the addresses are what
	// matters. tcp4 and tcp6 only (the library's default).
	return &guardedDialer{guard: ssrf.New(ssrf.WithAnyPort()), allow: allow, resolver: resolver, timeout: timeout}
}

// DialContext resolves addr's host, refuses every address that is neither
// permitted nor allowed, and connects to the first permitted address that
// answers. The net.Dialer's Control hook checks the socket's address again
// right before connect, so nothing reaches a refused address whatever path
// led to the dial.
func (d *guardedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("network %q is not allowed", network)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &invalidHostError{host: addr, why: err.Error()}
	}
	ip, isIP, err := parseHost(host)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if isIP {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = d.resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		// Go's resolver hands A records back as IPv4-mapped IPv6 addresses:
		// judge them as the IPv4 addresses they are. (A literal mapped
		// address in a URL stays mapped, and is refused as such.)
		for i := range addrs {
			addrs[i] = addrs[i].Unmap()
		}
		if len(addrs) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
	}
	permitted := map[netip.AddrPort]bool{}
	var order []netip.AddrPort
	var refused error
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, &invalidHostError{host: addr, why: "bad port"}
	}
	for _, a := range addrs {
		if err := d.check(host, a, port); err != nil {
			if refused == nil {
				refused = err
			}
			continue
		}
		// Keyed unmapped: the dialer hands Control the IPv4 form.
		ap := netip.AddrPortFrom(a.Unmap(), uint16(p))
		if !permitted[ap] {
			permitted[ap] = true
			order = append(order, ap)
		}
	}
	if len(order) == 0 {
		return nil, refused
	}
	nd := &net.Dialer{
		Timeout: d.timeout,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: %w", address, err)
			}
			if permitted[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] {
				d.connects.Add(1)
				return nil
			}
			return &DestinationRefusedError{Addr: ap.Addr(), Reason: describeAddr(ap.Addr())}
		},
	}
	var errs []error
	for _, ap := range order {
		c, err := nd.DialContext(ctx, network, ap.String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// check returns a *DestinationRefusedError unless a is permitted for host.
func (d *guardedDialer) check(host string, a netip.Addr, port string) error {
	if a.Zone() != "" {
		return &DestinationRefusedError{Host: host, Addr: a, Reason: describeAddr(a)}
	}
	if d.allow.allows(host, a, port) {
		return nil
	}
	// IPv4-mapped addresses are refused whatever they map to: the library
	// treats them as IPv6 outside global unicast.
	if err := d.guard.SafeAddr(a); err != nil {
		return &DestinationRefusedError{Host: host, Addr: a, Reason: describeAddr(a)}
	}
	return nil
}
