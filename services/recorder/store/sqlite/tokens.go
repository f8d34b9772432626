package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// CreateToken implements store.Tokens.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO tokens (`+sqlstore.TokenColumns+`) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)`,
		t.ID, t.Name, t.OrgID, t.WorkspaceID, t.Role, t.Hash, fmtTime(t.CreatedAt), fmtTimePtr(t.ExpiresAt), fmtTimePtr(t.RevokedAt))
	var se *msqlite.Error
	return sqlstore.TokenCreated(t.ID, err, errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

// Token implements store.Tokens.
func (s *Store) Token(ctx context.Context, id string) (store.Token, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT `+sqlstore.TokenColumns+` FROM tokens WHERE token_id = ?1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("%w: %s", store.ErrTokenNotFound, id)
	}
	return t, err
}

// ListTokens implements store.Tokens.
func (s *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	return query(ctx, s.db, "list tokens", func(rows *sql.Rows) (store.Token, error) { return scanToken(rows) },
		`SELECT `+sqlstore.TokenColumns+` FROM tokens ORDER BY created_at, token_id`)
}

// RevokeToken implements store.Tokens.
func (s *Store) RevokeToken(ctx context.Context, id string, at time.Time) error {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?2) WHERE token_id = ?1`, id, fmtTime(at))
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	return sqlstore.TokenRevoked(id, n, err)
}

func scanToken(row interface{ Scan(...any) error }) (store.Token, error) {
	var (
		t                store.Token
		created          string
		expires, revoked sql.NullString
	)
	if err := row.Scan(&t.ID, &t.Name, &t.OrgID, &t.WorkspaceID, &t.Role, &t.Hash, &created, &expires, &revoked); err != nil {
		return t, err
	}
	var err error
	if t.CreatedAt, err = parseTime(created); err != nil {
		return t, err
	}
	if t.ExpiresAt, err = parseTimeNull(expires); err != nil {
		return t, err
	}
	t.RevokedAt, err = parseTimeNull(revoked)
	return t, err
}
