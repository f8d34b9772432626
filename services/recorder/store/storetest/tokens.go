package storetest

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// runTokenContract checks store.Tokens: a token reads back as written (times
// to the microsecond, UTC), ids are unique, the list is oldest first and
// holds revoked tokens, and a revocation keeps its first time.
func runTokenContract(t *testing.T, newStore func(t *testing.T) store.Store) {
	exp := Base.Add(30 * 24 * time.Hour)
	tokens := []store.Token{
		{ID: "0000000000000001", Name: "ci viewer", OrgID: "org-a", WorkspaceID: "ws-1", Role: "viewer",
			Hash: []byte{1, 2, 3, 0, 255}, CreatedAt: Base, ExpiresAt: &exp},
		{ID: "0000000000000002", Name: "ops", OrgID: "*", Role: "admin", Hash: []byte("h2"), CreatedAt: Base.Add(time.Second)},
		{ID: "0000000000000003", Name: "approver", OrgID: "org-b", Role: "approver", Hash: []byte("h3"), CreatedAt: Base.Add(time.Second)},
		{ID: "0000000000000004", Name: "ci producer", OrgID: "org-b", WorkspaceID: "ws-2", Role: "producer", Hash: []byte("h4"),
			CreatedAt: Base.Add(2 * time.Second)},
	}
	t.Run("TokensRoundTrip", func(t *testing.T) {
		s := newStore(t)
		for _, tok := range []store.Token{tokens[2], tokens[0], tokens[3], tokens[1]} {
			if err := s.CreateToken(ctx(t), tok); err != nil {
				t.Fatalf("CreateToken %s: %v", tok.ID, err)
			}
		}
		for _, want := range tokens {
			got, err := s.Token(ctx(t), want.ID)
			if err != nil {
				t.Fatalf("Token %s: %v", want.ID, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Token %s = %+v, want %+v", want.ID, got, want)
			}
		}
		list, err := s.ListTokens(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(list, tokens) {
			t.Errorf("ListTokens = %+v, want oldest first then by id %+v", list, tokens)
		}
	})
	t.Run("TokenIDsAreUnique", func(t *testing.T) {
		s := newStore(t)
		if err := s.CreateToken(ctx(t), tokens[0]); err != nil {
			t.Fatal(err)
		}
		dup := tokens[1]
		dup.ID = tokens[0].ID
		if err := s.CreateToken(ctx(t), dup); !errors.Is(err, store.ErrTokenExists) {
			t.Fatalf("CreateToken with a taken id: %v, want ErrTokenExists", err)
		}
		got, err := s.Token(ctx(t), tokens[0].ID)
		if err != nil || got.Name != tokens[0].Name {
			t.Fatalf("the first token changed: %+v, %v", got, err)
		}
	})
	t.Run("TokenNotFound", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.Token(ctx(t), "ffffffffffffffff"); !errors.Is(err, store.ErrTokenNotFound) {
			t.Errorf("Token of an unknown id: %v, want ErrTokenNotFound", err)
		}
		if err := s.RevokeToken(ctx(t), "ffffffffffffffff", Base); !errors.Is(err, store.ErrTokenNotFound) {
			t.Errorf("RevokeToken of an unknown id: %v, want ErrTokenNotFound", err)
		}
		if list, err := s.ListTokens(ctx(t)); err != nil || len(list) != 0 {
			t.Errorf("ListTokens of an empty store = %v, %v", list, err)
		}
	})
	t.Run("RevocationKeepsItsFirstTime", func(t *testing.T) {
		s := newStore(t)
		if err := s.CreateToken(ctx(t), tokens[0]); err != nil {
			t.Fatal(err)
		}
		first, second := Base.Add(time.Hour), Base.Add(2*time.Hour)
		for _, at := range []time.Time{first, second} {
			if err := s.RevokeToken(ctx(t), tokens[0].ID, at); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Token(ctx(t), tokens[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.RevokedAt == nil || !got.RevokedAt.Equal(first) {
			t.Errorf("revoked_at = %v, want the first revocation %v", got.RevokedAt, first)
		}
	})
}
