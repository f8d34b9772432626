// Package pii finds personal data in text, so that what an operator is shown
// of a tool call (an approval's arguments summary) carries none of it: e-mail
// addresses, phone numbers, payment card numbers, national ids (US social
// security numbers, UK national insurance numbers), IBANs and IP addresses.
//
// A recogniser with a check uses it, so a match is a value that could exist,
// not a string of the right shape: a card number passes the Luhn check, an
// IBAN its country's length and the ISO 7064 mod-97 check, an SSN the rules
// of the numbers the SSA issues, an IP address the standard library's
// parser, and a phone number libphonenumber's metadata
// (github.com/nyaruka/phonenumbers, its maintained Go port: no hand-written
// table of the world's numbering plans could keep up). Text is scanned once
// per kind; matches never overlap.
package pii

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/nyaruka/phonenumbers"
)

// Kind is a kind of personal data.
type Kind string

// Kinds of personal data, in the order the scanner looks for them (an
// earlier kind's match wins a span).
const (
	Email      Kind = "email"
	IBAN       Kind = "iban"
	Card       Kind = "card"
	NationalID Kind = "national_id"
	IP         Kind = "ip"
	Phone      Kind = "phone"
)

// Kinds are every kind, in scanning order.
func Kinds() []Kind { return []Kind{Email, IBAN, Card, NationalID, IP, Phone} }

// ParseKinds reads a list of kinds: "all", "none", or kinds separated by
// commas.
func ParseKinds(s string) ([]Kind, error) {
	switch s = strings.TrimSpace(s); s {
	case "all":
		return Kinds(), nil
	case "none", "":
		return []Kind{}, nil
	}
	var out []Kind
	for f := range strings.SplitSeq(s, ",") {
		k := Kind(strings.TrimSpace(f))
		if !slices.Contains(Kinds(), k) {
			return nil, fmt.Errorf("pii kind %q is not one of all, none, %s", k, joinKinds(Kinds()))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func joinKinds(ks []Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// Match is one finding: its kind and its byte span in the text.
type Match struct {
	Kind       Kind
	Start, End int
}

// Scanner finds the kinds it was made for. It is immutable and safe for
// concurrent use.
type Scanner struct {
	kinds  []Kind
	region string
}

// DefaultRegion is the region of phone numbers written without a country
// code.
const DefaultRegion = "US"

// New is a scanner for kinds (none given: every kind).
func New(kinds ...Kind) *Scanner {
	if kinds == nil {
		kinds = Kinds()
	}
	var ordered []Kind
	for _, k := range Kinds() {
		if slices.Contains(kinds, k) {
			ordered = append(ordered, k)
		}
	}
	return &Scanner{kinds: ordered, region: DefaultRegion}
}

// WithRegion is s reading phone numbers without a country code as those of
// region (ISO 3166-1 alpha-2, such as GB).
func (s *Scanner) WithRegion(region string) *Scanner {
	c := *s
	c.region = strings.ToUpper(region)
	return &c
}

// Kinds are what s looks for.
func (s *Scanner) Kinds() []Kind { return slices.Clone(s.kinds) }

var (
	emailRE = regexp.MustCompile(`[A-Za-z0-9][A-Za-z0-9._%+\-]*@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,63}`)
	ibanRE  = regexp.MustCompile(`[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}`)
	cardRE  = regexp.MustCompile(`[0-9](?:[ \-]?[0-9]){12,18}`)
	ssnRE   = regexp.MustCompile(`[0-9]{3}[\- ][0-9]{2}[\- ][0-9]{4}`)
	ninoRE  = regexp.MustCompile(`[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-D]`)
	ipv4RE  = regexp.MustCompile(`[0-9]{1,3}(?:\.[0-9]{1,3}){3}`)
	ipv6RE  = regexp.MustCompile(`[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:%[0-9A-Za-z]+)?`)
	phoneRE = regexp.MustCompile(`\+?\(?[0-9](?:[ .\-()]{0,2}[0-9]){6,16}`)
)

// Find returns the matches in text, ordered by position, never overlapping.
func (s *Scanner) Find(text string) []Match {
	var out []Match
	taken := func(a, b int) bool {
		for _, m := range out {
			if a < m.End && m.Start < b {
				return true
			}
		}
		return false
	}
	add := func(k Kind, re *regexp.Regexp, ok func(string) bool) {
		for _, loc := range re.FindAllStringIndex(text, -1) {
			a, b := loc[0], loc[1]
			if k == Phone {
				a, b = balanced(text, a, b)
			}
			if !bounded(text, a, b) || taken(a, b) || !ok(text[a:b]) {
				continue
			}
			out = append(out, Match{Kind: k, Start: a, End: b})
		}
	}
	for _, k := range s.kinds {
		switch k {
		case Email:
			add(Email, emailRE, func(string) bool { return true })
		case IBAN:
			add(IBAN, ibanRE, validIBAN)
		case Card:
			add(Card, cardRE, validCard)
		case NationalID:
			add(NationalID, ssnRE, validSSN)
			add(NationalID, ninoRE, func(string) bool { return true })
		case IP:
			add(IP, ipv4RE, validIP)
			add(IP, ipv6RE, validIPv6)
		case Phone:
			add(Phone, phoneRE, s.validPhone)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// bounded says whether text[a:b] stands alone: not a piece of a longer
// word, number or dotted string (an id, a version, a hash).
func bounded(text string, a, b int) bool {
	word := func(c byte) bool {
		return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
	}
	if a > 0 {
		c := text[a-1]
		if word(c) || c == '@' || ((c == '.' || c == '-' || c == ':' || c == '/') && a > 1 && word(text[a-2])) {
			return false
		}
	}
	if b < len(text) {
		c := text[b]
		if word(c) || c == '@' || ((c == '.' || c == '-' || c == ':') && b+1 < len(text) && word(text[b+1])) {
			return false
		}
	}
	return true
}

// balanced trims a phone number's span of a parenthesis it does not close
// or open: "(415-555-2671)" is the number in parentheses.
func balanced(text string, a, b int) (int, int) {
	m := text[a:b]
	if strings.HasPrefix(m, "(") && !strings.Contains(m, ")") {
		a++
	}
	if strings.HasSuffix(m, ")") && !strings.Contains(m, "(") {
		b--
	}
	return a, b
}

// Redact is text with each match replaced by its kind in brackets
// ("[email]").
func (s *Scanner) Redact(text string) string {
	ms := s.Find(text)
	if len(ms) == 0 {
		return text
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		b.WriteString(text[last:m.Start])
		b.WriteString("[" + string(m.Kind) + "]")
		last = m.End
	}
	b.WriteString(text[last:])
	return b.String()
}

func digits(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}

// validCard: 13 to 19 digits passing the Luhn check, of a length some
// card network issues, not all one digit.
func validCard(s string) bool {
	d := digits(s)
	if len(d) < 13 || len(d) > 19 || strings.Count(d, d[:1]) == len(d) {
		return false
	}
	sum := 0
	for i := range len(d) {
		n := int(d[len(d)-1-i] - '0')
		if i%2 == 1 {
			if n *= 2; n > 9 {
				n -= 9
			}
		}
		sum += n
	}
	return sum%10 == 0
}

// validSSN: the rules of the numbers the SSA issues: the area is not 000,
// 666 or 900-999, the group not 00, the serial not 0000.
func validSSN(s string) bool {
	d := digits(s)
	if len(d) != 9 || s[3] != s[6] { // one separator, used twice
		return false
	}
	area, group, serial := d[:3], d[3:5], d[5:]
	return area != "000" && area != "666" && area[0] != '9' && group != "00" && serial != "0000"
}

// ibanLengths is the length of an IBAN of each country of the IBAN
// registry (SWIFT, ISO 13616).
var ibanLengths = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27, "BR": 29,
	"BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
	"ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
	"HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
	"LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20,
	"MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25,
	"QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27,
	"SO": 23, "ST": 25, "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}

// validIBAN: the country's length and ISO 7064 mod 97 = 1 after moving the
// first four characters to the end (A = 10 ... Z = 35).
func validIBAN(s string) bool {
	v := strings.ReplaceAll(s, " ", "")
	if n, ok := ibanLengths[v[:2]]; !ok || n != len(v) {
		return false
	}
	v = v[4:] + v[:4]
	rem := 0
	for i := range len(v) {
		c := v[i]
		switch {
		case c >= '0' && c <= '9':
			rem = (rem*10 + int(c-'0')) % 97
		case c >= 'A' && c <= 'Z':
			rem = (rem*100 + int(c-'A'+10)) % 97
		default:
			return false
		}
	}
	return rem == 1
}

// validIP: an IPv4 address, no octet with a leading zero, not 0.0.0.0.
func validIP(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is4() && !a.IsUnspecified()
}

// validIPv6: an IPv6 address of at least three groups (so that a time
// such as 10:30:00 is not one: netip reads it as no address anyway).
func validIPv6(s string) bool {
	if strings.Count(s, ":") < 2 {
		return false
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && !a.IsUnspecified()
}

// validPhone: a number libphonenumber calls valid, read in s's region
// unless it starts with + (a country code).
func (s *Scanner) validPhone(text string) bool {
	d := digits(text)
	if len(d) < 7 || len(d) > 15 {
		return false
	}
	n, err := phonenumbers.Parse(text, s.region)
	return err == nil && phonenumbers.IsValidNumber(n)
}
