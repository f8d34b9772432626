// Package pgschema makes throwaway Postgres schemas: a schema of its own, and
// a connection string whose connections use it, for whatever must start from
// empty tables and leave nothing behind (each test, each bench run).
package pgschema

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scratch is a schema made by New.
type Scratch struct {
	Name string
	// DSN is the base connection string with its search_path set to Name
	// alone, so that every table created through it, migrations included,
	// lands in the schema.
	DSN  string
	base string
}

// New creates a schema named prefix, the creation time in Unix seconds, '_'
// and random hex (so that a leftover can be told stale, and parallel users
// never collide) in the database at base, over conn when it is not nil.
func New(ctx context.Context, conn *pgx.Conn, base, prefix string) (*Scratch, error) {
	if conn == nil {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
		conn = c
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := prefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + hex.EncodeToString(b[:])
	dsn, err := WithSearchPath(base, name)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	return &Scratch{Name: name, DSN: dsn, base: base}, nil
}

// Drop drops the schema with everything in it.
func (s *Scratch) Drop(ctx context.Context) error {
	c, err := pgx.Connect(ctx, s.base)
	if err != nil {
		return fmt.Errorf("drop schema %s: %w", s.Name, err)
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.Name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", s.Name, err)
	}
	return nil
}

// Created is the creation time encoded in a name New gave with prefix;
// false for any other name.
func Created(name, prefix string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return time.Time{}, false
	}
	ts, _, ok := strings.Cut(rest, "_")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// WithSearchPath returns dsn (a URL or a keyword/value string) with its
// search_path set to schema. An unparsable URL's error does not repeat it:
// it may hold a password.
func WithSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return "", fmt.Errorf("database url: %w", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return strings.TrimSpace(dsn) + " search_path=" + schema, nil
}
