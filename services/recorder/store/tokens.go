package store

import (
	"context"
	"errors"
	"time"
)

// Tokens is where the recorder keeps its API tokens (package auth issues and
// checks them): never a token itself, only its id and the hash of its secret.
// Both backends keep them in a tokens table; the contract suite checks them.
type Tokens interface {
	// CreateToken stores a new token; an error wrapping ErrTokenExists when
	// its id is taken.
	CreateToken(ctx context.Context, t Token) error
	// Token returns one token by id, revoked or not, or an error wrapping
	// ErrTokenNotFound.
	Token(ctx context.Context, id string) (Token, error)
	// ListTokens returns every token, revoked ones included, oldest first
	// (by created_at, then id).
	ListTokens(ctx context.Context) ([]Token, error)
	// RevokeToken marks a token revoked at at; revoking a revoked token
	// keeps its first revocation time. An error wrapping ErrTokenNotFound
	// when there is no such token.
	RevokeToken(ctx context.Context, id string, at time.Time) error
}

// Token is one API token as the store keeps it. The secret is not here: Hash
// is its digest (package auth says which), and a token presented is checked
// by hashing its secret and comparing.
type Token struct {
	ID          string
	Name        string
	OrgID       string // "*": every tenant (an operator's admin token)
	WorkspaceID string // "": every workspace of the org
	Role        string
	Hash        []byte
	CreatedAt   time.Time
	ExpiresAt   *time.Time
	RevokedAt   *time.Time
}

// Errors of Tokens.
var (
	ErrTokenNotFound = errors.New("token not found")
	ErrTokenExists   = errors.New("token id already exists")
)
