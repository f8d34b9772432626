package web

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseHost(t *testing.T) {
	cases := []struct {
		host    string
		want    string // "" for a domain name
		invalid string // part of the error
	}{
		{host: "example.com"},
		{host: "localhost"},
		{host: "127.0.0.1", want: "127.0.0.1"},
		{host: "2130706433", want: "127.0.0.1"},
		{host: "0177.0.0.1", want: "127.0.0.1"},
		{host: "0x7f000001", want: "127.0.0.1"},
		{host: "0x7F.1", want: "127.0.0.1"},
		{host: "127.1", want: "127.0.0.1"},
		{host: "127.0.1", want: "127.0.0.1"},
		{host: "0", want: "0.0.0.0"},
		{host: "0.0.0.0", want: "0.0.0.0"},
		{host: "169.254.169.254", want: "169.254.169.254"},
		{host: "2852039166", want: "169.254.169.254"},
		{host: "0251.0376.0251.0376", want: "169.254.169.254"},
		{host: "127.0.0.1.", want: "127.0.0.1"},
		{host: "::1", want: "::1"},
		{host: "::", want: "::"},
		{host: "::ffff:127.0.0.1", want: "::ffff:127.0.0.1"},
		{host: "fd00:ec2::254", want: "fd00:ec2::254"},
		{host: "1.2.3.4.5", invalid: "at most four parts"},
		{host: "256.0.0.1", invalid: "larger than 255"},
		{host: "1.2.3.256", invalid: "out of range"},
		{host: "4294967296", invalid: "out of range"},
		{host: "foo.123", invalid: "not a base-10 number"},
		{host: "08.0.0.1", invalid: "not a base-8 number"},
		{host: "::zz", invalid: "not an IPv6 address"},
		{host: "", invalid: "empty"},
		{host: "123abc", want: ""}, // a label that is not all digits: a name
	}
	for _, c := range cases {
		t.Run(c.host, func(t *testing.T) {
			ip, isIP, err := parseHost(c.host)
			if c.invalid != "" {
				require.ErrorContains(t, err, c.invalid)
				return
			}
			require.NoError(t, err)
			if c.want == "" {
				require.False(t, isIP, "a domain name")
				return
			}
			require.True(t, isIP)
			require.Equal(t, netip.MustParseAddr(c.want), ip)
		})
	}
}

func TestDescribeAddr(t *testing.T) {
	cases := map[string]string{
		"127.0.0.1":        "a loopback address",
		"127.8.9.10":       "a loopback address",
		"::1":              "a loopback address",
		"0.0.0.0":          "an unspecified address",
		"::":               "an unspecified address",
		"10.1.2.3":         "a private address",
		"172.16.0.1":       "a private address",
		"192.168.1.1":      "a private address",
		"fc00::1":          "a private address",
		"fd12:3456::1":     "a private address",
		"169.254.1.1":      "a link-local address",
		"fe80::1":          "a link-local address",
		"169.254.169.254":  "the cloud metadata address",
		"fd00:ec2::254":    "the cloud metadata address",
		"100.64.0.1":       "a carrier-grade NAT (shared) address",
		"224.0.0.1":        "a multicast address",
		"ff02::1":          "a multicast address",
		"255.255.255.255":  "the broadcast address",
		"0.1.2.3":          `a "this network" address`,
		"192.0.2.1":        "a special-purpose address",
		"::ffff:127.0.0.1": "an IPv4-mapped IPv6 address (of 127.0.0.1, a loopback address)",
		"::ffff:8.8.8.8":   "an IPv4-mapped IPv6 address (of 8.8.8.8)",
	}
	for addr, want := range cases {
		require.Equal(t, want, describeAddr(netip.MustParseAddr(addr)), addr)
	}
}

// TestGuardClassification checks the guard's decision on each kind of
// address (the library's tables) and that the allow-list overrides it.
func TestGuardClassification(t *testing.T) {
	d := newGuardedDialer(nil, nil, 0)
	refused := []string{
		"127.0.0.1", "127.255.255.254", "0.0.0.0", "10.0.0.1", "172.31.255.255", "192.168.0.1",
		"169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.255", "224.0.0.1", "239.255.255.255",
		"255.255.255.255", "192.0.2.1", "198.18.0.1", "240.0.0.1",
		"::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1", "::ffff:8.8.8.8",
		"64:ff9b::7f00:1", "2001:db8::1", "2002:7f00:1::1", "2001::1",
	}
	for _, a := range refused {
		err := d.check("", netip.MustParseAddr(a), "80")
		var re *DestinationRefusedError
		require.ErrorAs(t, err, &re, "%s must be refused", a)
		require.Contains(t, err.Error(), "destination "+netip.MustParseAddr(a).String()+" is ")
		require.Contains(t, err.Error(), EnvAllowHosts)
	}
	permitted := []string{"8.8.8.8", "1.1.1.1", "93.184.215.14", "100.63.255.255", "100.128.0.1", "2606:4700:4700::1111", "2a00:1450:4001::1"}
	for _, a := range permitted {
		require.NoError(t, d.check("", netip.MustParseAddr(a), "443"), a)
	}
	zoned := netip.MustParseAddr("fe80::1%eth0")
	require.Error(t, d.check("", zoned, "80"))

	allow, err := parseAllowHosts("127.0.0.1:8080, internal.example, [::1]")
	require.NoError(t, err)
	d = newGuardedDialer(allow, nil, 0)
	require.NoError(t, d.check("127.0.0.1", netip.MustParseAddr("127.0.0.1"), "8080"))
	require.Error(t, d.check("127.0.0.1", netip.MustParseAddr("127.0.0.1"), "8081"), "another port")
	require.NoError(t, d.check("internal.example", netip.MustParseAddr("10.0.0.5"), "443"), "an allowed name, any port")
	require.NoError(t, d.check("INTERNAL.example.", netip.MustParseAddr("10.0.0.5"), "80"), "names match without case or the trailing dot")
	require.Error(t, d.check("other.example", netip.MustParseAddr("10.0.0.5"), "443"))
	require.NoError(t, d.check("x", netip.MustParseAddr("::1"), "1"), "an allowed address, any port")
	require.Error(t, d.check("x", netip.MustParseAddr("::ffff:127.0.0.1"), "8080"), "a mapped address is not its IPv4 address")
}

func TestParseAllowHosts(t *testing.T) {
	l, err := parseAllowHosts(" api.internal:8443 ,127.0.0.1:9000,[::1]:80,[fe80::]  , ,Example.COM.")
	require.NoError(t, err)
	require.Equal(t, "api.internal:8443,127.0.0.1:9000,[::1]:80,[fe80::],example.com", allowList(l).String())

	for _, bad := range []string{"http://x", "x:0", "x:70000", "x:port", "2130706433", "0x7f000001", "127.1", "[fe80::1%eth0]", "a/b", "*.example.com"} {
		_, err := parseAllowHosts(bad)
		require.Error(t, err, bad)
	}
	require.ErrorContains(t, Config{AllowHosts: []string{"ok:1", "bad:0"}}.Validate(), `allow-list entry "bad:0"`)
	require.NoError(t, Config{AllowHosts: []string{"a:1", "b"}}.Validate())
}

// FuzzParseHost checks that the host parser never panics and that every
// address it returns round-trips through its canonical form.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"2130706433", "0177.0.0.1", "0x7f000001", "127.1", "::ffff:127.0.0.1", "a.b", "1.2.3.4.5", "0x", "00", ".", "..1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		ip, isIP, err := parseHost(host)
		if err != nil || !isIP {
			return
		}
		if strings.Contains(host, ":") {
			return
		}
		again, isIP2, err := parseHost(ip.String())
		if err != nil || !isIP2 || again != ip {
			t.Fatalf("%q -> %s does not round-trip: %v %v", host, ip, again, err)
		}
	})
}
