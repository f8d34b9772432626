package pii_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/policy/pii"
)

// TestCorpus: each positive is found as its kind, whole; each near miss (a
// value of the right shape that fails its check, or a familiar string that
// only looks like one) is left alone.
func TestCorpus(t *testing.T) {
	s := pii.New()
	positives := []struct {
		kind pii.Kind
		text string
	}{
		{pii.Email, "jane.doe@example.com"},
		{pii.Email, "ops+alerts@mail.acme.co.uk"},
		{pii.Email, "J_Smith-99@sub-domain.example.org"},
		{pii.Card, "4111 1111 1111 1111"},
		{pii.Card, "4111-1111-1111-1111"},
		{pii.Card, "5500005555555559"},
		{pii.Card, "378282246310005"}, // Amex, 15 digits
		{pii.Card, "6011111111111117"},
		{pii.NationalID, "123-45-6789"},
		{pii.NationalID, "078 05 1120"},
		{pii.NationalID, "AB 12 34 56 C"},
		{pii.NationalID, "JG103759A"},
		{pii.IBAN, "DE89370400440532013000"},
		{pii.IBAN, "GB82 WEST 1234 5698 7654 32"},
		{pii.IBAN, "FR1420041010050500013M02606"},
		{pii.IP, "192.168.1.20"},
		{pii.IP, "8.8.8.8"},
		{pii.IP, "2001:db8::ff00:42:8329"},
		{pii.IP, "fe80::1ff:fe23:4567:890a"},
		{pii.Phone, "+1 415 555 2671"},
		{pii.Phone, "(415) 555-2671"},
		{pii.Phone, "415-555-2671"},
		{pii.Phone, "+44 20 7946 0958"},
		{pii.Phone, "+33 6 12 34 56 78"},
		{pii.Phone, "+49 30 901820"},
	}
	for _, p := range positives {
		for _, text := range []string{p.text, "contact: " + p.text + ", thanks", "(" + p.text + ")"} {
			ms := s.Find(text)
			require.Len(t, ms, 1, "%q: %v", text, ms)
			require.Equal(t, p.kind, ms[0].Kind, text)
			require.Equal(t, p.text, text[ms[0].Start:ms[0].End], text)
			require.Equal(t, strings.Replace(text, p.text, "["+string(p.kind)+"]", 1), s.Redact(text))
		}
	}
	nearMisses := []string{
		"4111 1111 1111 1112",    // fails Luhn
		"0000 0000 0000 0000",    // one digit throughout
		"order 1234567890123",    // 13 digits, fails Luhn
		"000-12-3456",            // area 000
		"666-12-3456",            // area 666
		"912-34-5678",            // area 9xx
		"123-00-4567",            // group 00
		"123-45-0000",            // serial 0000
		"123-45 6789",            // mixed separators
		"DE89370400440532013001", // fails mod 97
		"DE8937040044053201300",  // DE is 22 characters
		"XX89370400440532013000", // no such country
		"999.1.1.1",              // not an address
		"version 1.2.3.4.5",      // a dotted version
		"0.0.0.0",                // unspecified
		"10:30:00",               // a time
		"2026-12-02",             // a date
		"2026-12-02T10:30:00Z",   // a timestamp
		"user@localhost",         // no domain
		"@handle",                // a handle
		"a@b",                    // no domain
		"sha 3f786850e387550fdab836ed7e6dc881de23001b", // a hash
		"call 555-0100 ext",                            // 7 digits: no area code
		"build 20261202103000",                         // a build number
		"id 123456789",                                 // nine digits without separators
		"pin 1234",                                     // short
		"row 42, col 7",                                // small numbers
		"ticket TW-1234567",                            // an id with a prefix
		"uuid 123e4567-e89b-12d3-a456-426614174000",
	}
	for _, text := range nearMisses {
		require.Empty(t, s.Find(text), "%q", text)
		require.Equal(t, text, s.Redact(text))
	}
}

// TestKinds: a scanner finds its kinds only, and the list reads as the
// configuration writes it.
func TestKinds(t *testing.T) {
	text := "mail jane@example.com from 10.0.0.7"
	require.Equal(t, "mail [email] from 10.0.0.7", pii.New(pii.Email).Redact(text))
	require.Equal(t, "mail jane@example.com from [ip]", pii.New(pii.IP).Redact(text))
	require.Equal(t, "mail [email] from [ip]", pii.New().Redact(text))
	require.Equal(t, text, pii.New([]pii.Kind{}...).Redact(text), "an empty list finds nothing")

	for in, want := range map[string][]pii.Kind{
		"all": pii.Kinds(), "none": {}, "": {}, "email, phone": {pii.Email, pii.Phone}, "ip,ip": {pii.IP},
	} {
		got, err := pii.ParseKinds(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := pii.ParseKinds("email,passport")
	require.ErrorContains(t, err, `pii kind "passport" is not one of all, none, email`)
}

// TestRegion: a number without a country code is read in the scanner's
// region.
func TestRegion(t *testing.T) {
	uk := "ring 020 7946 0958 today"
	require.Empty(t, pii.New(pii.Phone).Find(uk), "not a US number")
	require.Equal(t, "ring [phone] today", pii.New(pii.Phone).WithRegion("gb").Redact(uk))
}

// FuzzRedact: whatever the text, redaction keeps it valid UTF-8, never
// lengthens a text without findings, and finds nothing more in its own
// output's placeholders.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"jane@example.com", "4111 1111 1111 1111", "+1 415 555 2671", "::1", "GB82 WEST 1234 5698 7654 32", "é@ü.de", "1.1.1.1.1"} {
		f.Add(s)
	}
	s := pii.New()
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) {
			return
		}
		ms := s.Find(text)
		for i, m := range ms {
			if m.Start < 0 || m.End > len(text) || m.Start >= m.End || (i > 0 && ms[i-1].End > m.Start) {
				t.Fatalf("Find(%q): bad matches %v", text, ms)
			}
		}
		out := s.Redact(text)
		if !utf8.ValidString(out) {
			t.Fatalf("Redact(%q) = %q: not UTF-8", text, out)
		}
		if len(ms) == 0 && out != text {
			t.Fatalf("Redact(%q) changed a text without findings", text)
		}
	})
}
