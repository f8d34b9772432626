package pages

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzSafeNext: whatever a login form's next says, the redirect stays on
// this server: a path, never a host or a scheme a browser would follow.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/", "/runs/r1?x=1#c", "//evil.example", `/\evil.example`, "https://evil.example/", "javascript:alert(1)",
		"/%2F%2Fevil.example", "/\t/evil.example", " /x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := safeNext(next)
		if !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") || strings.HasPrefix(got, `/\`) {
			t.Fatalf("safeNext(%q) = %q: not a local path", next, got)
		}
		u, err := url.Parse(got)
		if err != nil || u.Host != "" || u.Scheme != "" {
			t.Fatalf("safeNext(%q) = %q: parses as %+v, %v", next, got, u, err)
		}
		// Browsers drop tabs and newlines from URLs: "/\t/evil" is "//evil".
		if cleaned := strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(got); strings.HasPrefix(cleaned, "//") || strings.HasPrefix(cleaned, `/\`) {
			t.Fatalf("safeNext(%q) = %q: a browser reads it as %q", next, got, cleaned)
		}
	})
}
