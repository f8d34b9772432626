// Package sqlstore is what the two SQL backends of store share, so that each
// rule of store.Store is written in SQL once: the ranking of statuses, the
// upsert of a tool call, how empty values map to NULL, the default deadlines,
// and running the goose migrations.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// WithTimeout bounds ctx by d unless the caller set a deadline.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Rank renders a CASE expression ranking expr as rank does for statuses
// (-1 for anything else).
func Rank(expr string, statuses []string, rank func(string) int) string {
	var b strings.Builder
	b.WriteString("(CASE " + expr)
	for _, s := range statuses {
		b.WriteString(" WHEN '" + s + "' THEN " + strconv.Itoa(rank(s)))
	}
	b.WriteString(" ELSE -1 END)")
	return b.String()
}

// RunRank is Rank for run statuses.
func RunRank(expr string) string { return Rank(expr, store.RunStatuses(), store.RunStatusRank) }

// StatusWins renders the condition under which a proposed run status (status,
// at) replaces the stored one (was, wasAt), by the rules of store.Write: the
// higher rank wins; within a rank, the later one, except between two ends,
// where the earlier one wins (a run stays as it ended); then the greater
// name. Both backends compare times in time order (Postgres timestamptz,
// SQLite fixed-width text).
func StatusWins(status, at, was, wasAt string) string {
	rank, wasRank := RunRank(status), RunRank(was)
	return "(" + rank + " > " + wasRank + " OR (" + rank + " = " + wasRank + " AND CASE WHEN " + rank + " = 3" +
		" THEN (" + wasAt + ", " + status + ") > (" + at + ", " + was + ")" +
		" ELSE (" + at + ", " + status + ") > (" + wasAt + ", " + was + ") END))"
}

// RunTakeSet is the part of the SET list of a runs merge (the stored row is
// r, the proposed one src: excluded, or an update's row) that takes the
// proposed value whole or keeps the stored one: the tenant when takeTenant
// holds, the agent when takeAgent does, and the status with its time,
// reason and end when wins does.
func RunTakeSet(src, takeTenant, takeAgent, wins string) string {
	var b strings.Builder
	for _, c := range []struct{ col, when string }{
		{"org_id", takeTenant}, {"workspace_id", takeTenant}, {"user_id", takeTenant}, {"agent", takeAgent},
		{"status", wins}, {"status_at", wins}, {"reason", wins}, {"completed_at", wins},
	} {
		fmt.Fprintf(&b, "\t%-12s = CASE WHEN %s THEN %s.%s ELSE r.%s END,\n", c.col, c.when, src, c.col, c.col)
	}
	return b.String()
}

// CallUpsertSet is the SET list of a tool_calls upsert (Postgres and SQLite
// both read excluded, the proposed row, as c the stored one): the status
// moves forward only; until the envelope arrives, the first event that names
// a field sets it; the envelope then overrides name, version, input and
// t_start, and alone sets the rest (its cost among them). The queue is the
// first named.
var CallUpsertSet = func() string {
	statuses := []string{store.CallRequested, store.CallApproved, store.CallStarted, store.CallCompleted}
	fwd := Rank("excluded.status", statuses, store.CallStatusRank) + " > " + Rank("c.status", statuses, store.CallStatusRank)
	newEnv := "(c.envelope IS NULL AND excluded.envelope IS NOT NULL)"
	shared := func(col string) string {
		return col + " = CASE WHEN " + newEnv + " THEN COALESCE(excluded." + col + ", c." + col + ") ELSE COALESCE(c." + col + ", excluded." + col + ") END"
	}
	fromEnv := func(col string) string {
		return col + " = CASE WHEN " + newEnv + " THEN excluded." + col + " ELSE c." + col + " END"
	}
	return `
	status    = CASE WHEN ` + fwd + ` THEN excluded.status ELSE c.status END,
	seq       = COALESCE(c.seq, excluded.seq),
	iteration = COALESCE(c.iteration, excluded.iteration),
	queue     = COALESCE(c.queue, excluded.queue),
	` + shared("name") + `,
	` + shared("version") + `,
	` + shared("input") + `,
	` + shared("t_start") + `,
	` + fromEnv("error_code") + `,
	` + fromEnv("t_end") + `,
	` + fromEnv("latency_ms") + `,
	` + fromEnv("cached") + `,
	` + fromEnv("truncated") + `,
	` + fromEnv("cost") + `,
	envelope  = COALESCE(c.envelope, excluded.envelope)`
}()

// NullString maps "" to NULL.
func NullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// NullJSON maps absent and JSON-null documents to NULL.
func NullJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return b
}

// JSONText maps a JSON document to text: absent and JSON null to NULL.
func JSONText(b json.RawMessage) *string {
	if b = NullJSON(b); b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// Migrate brings the schema of db up to date with goose, from the numbered
// SQL files in the migrations folder of files (a backend's embedded tree);
// what names the database in errors, opts add to goose's options (a lock).
func Migrate(ctx context.Context, dialect goose.Dialect, db *sql.DB, files fs.FS, what string, log *slog.Logger,
	opts ...goose.ProviderOption) (store.MigrationResult, error) {
	if log == nil {
		log = slog.Default()
	}
	dir, err := fs.Sub(files, "migrations")
	if err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	opts = append(opts, goose.WithDisableGlobalRegistry(true), goose.WithSlog(log.With("component", "migrate")))
	p, err := goose.NewProvider(dialect, db, dir, opts...)
	if err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate %s: %w", what, err)
	}
	var res store.MigrationResult
	for _, r := range results {
		res.Applied = append(res.Applied, r.Source.Version)
	}
	if res.Version, err = p.GetDBVersion(ctx); err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: version: %w", err)
	}
	return res, nil
}

// Rows is the part of a result set Collect reads: pgx.Rows and *sql.Rows
// both have it.
type Rows interface {
	Next() bool
	Err() error
}

// TokenColumns are the columns of the tokens table, in the order both
// backends insert and scan them.
const TokenColumns = `token_id, name, org_id, workspace_id, role, hash, created_at, expires_at, revoked_at`

// TokenCreated is the result of a token's INSERT, given what the driver
// returned (err) and whether that was the token id's unique violation
// (duplicate): store.ErrTokenExists, the failure, or nil.
func TokenCreated(id string, err error, duplicate bool) error {
	switch {
	case duplicate:
		return fmt.Errorf("%w: %s", store.ErrTokenExists, id)
	case err != nil:
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

// TokenRevoked is the result of a token's revoking UPDATE, given the rows it
// changed and what the driver returned: store.ErrTokenNotFound when it
// changed none.
func TokenRevoked(id string, affected int64, err error) error {
	if err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	if affected == 0 {
		return fmt.Errorf("%w: %s", store.ErrTokenNotFound, id)
	}
	return nil
}

// ToPark is what an admission parks that is not stored yet, in order: each
// event's id and run, and its record encoded by store.EncodeParked.
func ToPark(a store.Admission) (ids, runs, docs []string, err error) {
	for _, p := range a.Park {
		if p.Stored {
			continue
		}
		doc, err := store.EncodeParked(p.Record)
		if err != nil {
			return nil, nil, nil, err
		}
		ids, runs, docs = append(ids, p.Record.Event.ID), append(runs, p.Record.Event.RunID), append(docs, string(doc))
	}
	return ids, runs, docs, nil
}

// OneCall is the one call of a read of the tool calls narrowed to callID
// (calls and err, as the read returned them), or store.ErrCallNotFound.
func OneCall(runID, callID string, calls []store.ToolCall, err error) (store.ToolCall, error) {
	if err != nil {
		return store.ToolCall{}, err
	}
	if len(calls) == 0 {
		return store.ToolCall{}, fmt.Errorf("%w: run %q call %q", store.ErrCallNotFound, runID, callID)
	}
	return calls[0], nil
}

// Collect scans every row of rows with scan and returns them in order (an
// empty slice, never nil, when there is none); a failure is wrapped with
// what ("verdicts of \"run-1\"").
func Collect[R Rows, T any](rows R, what string, scan func(R) (T, error)) ([]T, error) {
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
