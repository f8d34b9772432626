package auth

import (
	"crypto/sha256"
	"strings"
	"testing"
)

// TestAdminTokenComparedByDigest: the admin token is compared as its SHA-256
// digest, so that every comparison covers the same 32 bytes whatever the
// length of the credential presented (comparing the strings returns at once
// on a length mismatch, which times the token's length); only the exact
// token matches.
func TestAdminTokenComparedByDigest(t *testing.T) {
	const tok = "the-admin-token"
	a, err := New(Config{AdminToken: tok}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.adminDigest) != sha256.Size || strings.Contains(string(a.adminDigest), tok) {
		t.Fatalf("admin digest %x: want the token's SHA-256, not the token", a.adminDigest)
	}
	if !a.isAdminToken(tok) {
		t.Fatal("the admin token is not recognised")
	}
	for _, cred := range []string{"", "t", "the-admin-toke", "the-admin-tokeN", tok + "x", " " + tok, strings.Repeat("x", 4096)} {
		if a.isAdminToken(cred) {
			t.Errorf("%q taken for the admin token", cred)
		}
	}
	none, err := New(Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if none.adminDigest != nil || none.isAdminToken("") {
		t.Fatal("without an admin token nothing is the admin token, not even the empty credential")
	}
}
