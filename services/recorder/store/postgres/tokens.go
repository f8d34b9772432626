package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// CreateToken implements store.Tokens.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	_, err := s.pool.Exec(ctx, `INSERT INTO tokens (`+sqlstore.TokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		t.ID, t.Name, t.OrgID, t.WorkspaceID, t.Role, t.Hash, t.CreatedAt.UTC(), t.ExpiresAt, t.RevokedAt)
	var pe *pgconn.PgError
	return sqlstore.TokenCreated(t.ID, err, errors.As(err, &pe) && pe.Code == "23505") // unique_violation
}

// Token implements store.Tokens.
func (s *Store) Token(ctx context.Context, id string) (store.Token, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+sqlstore.TokenColumns+` FROM tokens WHERE token_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("%w: %s", store.ErrTokenNotFound, id)
	}
	return t, err
}

// ListTokens implements store.Tokens.
func (s *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	return query(ctx, s.pool, "list tokens", func(rows pgx.Rows) (store.Token, error) { return scanToken(rows) },
		`SELECT `+sqlstore.TokenColumns+` FROM tokens ORDER BY created_at, token_id`)
}

// RevokeToken implements store.Tokens.
func (s *Store) RevokeToken(ctx context.Context, id string, at time.Time) error {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, $2) WHERE token_id = $1`, id, at.UTC())
	return sqlstore.TokenRevoked(id, tag.RowsAffected(), err)
}

func scanToken(row pgx.Row) (store.Token, error) {
	var t store.Token
	if err := row.Scan(&t.ID, &t.Name, &t.OrgID, &t.WorkspaceID, &t.Role, &t.Hash, &t.CreatedAt, &t.ExpiresAt, &t.RevokedAt); err != nil {
		return t, err
	}
	t.CreatedAt = t.CreatedAt.UTC()
	if t.ExpiresAt != nil {
		u := t.ExpiresAt.UTC()
		t.ExpiresAt = &u
	}
	if t.RevokedAt != nil {
		u := t.RevokedAt.UTC()
		t.RevokedAt = &u
	}
	return t, nil
}
