// Package postgres is the recorder's production store: store.Store on
// Postgres (pgx), with its schema as goose migrations embedded in the binary
// (Migrate). Any number of recorders may share one database.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// Store is the store.Store on Postgres. Its tables live in the search_path of
// the pool's connections; Migrate creates them.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store on pool. The caller owns the pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// NewPool returns a pool for dsn (a URL or keyword/value string; a
// search_path parameter selects the schema). It does not connect: the first
// query does.
func NewPool(dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors can quote the connection string, password and all.
		return nil, errors.New("not a valid Postgres connection string")
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres pool: %w", err)
	}
	return pool, nil
}

// classify marks errors that retrying cannot fix: Postgres's data exceptions
// (class 22: a NUL byte in text, invalid UTF-8, a value out of range) and
// program limits (class 54: a document too large).
func classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54")) {
		return fmt.Errorf("%w: %w", store.ErrUnstorable, err)
	}
	return err
}

// Write implements Store.
func (s *Store) Write(ctx context.Context, recs ...store.Record) error {
	if len(recs) == 0 {
		return nil
	}
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return writeRecords(ctx, tx, recs) })
	return classify(err)
}

const runColumns = `r.run_id, r.org_id, r.workspace_id, r.user_id, r.agent, r.status, r.reason, r.trace_id,
	r.iterations, GREATEST(r.tool_calls, (SELECT count(*) FROM tool_calls tc WHERE tc.run_id = r.run_id))::integer,
	r.created_at, r.updated_at, r.completed_at, r.spend`

func scanRun(row pgx.Row, extra ...any) (store.Run, error) {
	var (
		run                          store.Run
		org, ws, user, agent, reason *string
		traceID                      *string
		completedAt                  *time.Time
		dest                         []any
	)
	dest = append(dest, &run.RunID, &org, &ws, &user, &agent, &run.Status, &reason, &traceID,
		&run.Iterations, &run.ToolCalls, &run.CreatedAt, &run.UpdatedAt, &completedAt, &run.Spend)
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return store.Run{}, err
	}
	run.Tenant.OrgID, run.Tenant.WorkspaceID, run.Tenant.UserID = deref(org), deref(ws), deref(user)
	run.Agent, run.Reason, run.TraceID = deref(agent), deref(reason), deref(traceID)
	run.CreatedAt, run.UpdatedAt = run.CreatedAt.UTC(), run.UpdatedAt.UTC()
	if completedAt != nil {
		t := completedAt.UTC()
		run.CompletedAt = &t
	}
	return run, nil
}

// Run implements Store.
func (s *Store) Run(ctx context.Context, runID string) (store.Run, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	var req, outputs, pinned, blob []byte
	run, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+runColumns+`, r.request, r.outputs, r.pinned, r.outputs_blob
		FROM runs r WHERE r.run_id = $1`, runID), &req, &outputs, &pinned, &blob)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Run{}, fmt.Errorf("%w: %q", store.ErrRunNotFound, runID)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("get run %q: %w", runID, err)
	}
	run.Request, run.Outputs, run.Pinned, run.OutputsBlob = req, outputs, pinned, blob
	return run, nil
}

// ListRuns implements Store. The runs it returns carry no Request, Outputs or
// Pinned: read one run for those.
func (s *Store) ListRuns(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	var (
		where []string
		args  []any
	)
	add := func(col, v string) {
		if v != "" {
			args = append(args, v)
			where = append(where, "r."+col+" = $"+strconv.Itoa(len(args)))
		}
	}
	add("status", f.Status)
	add("agent", f.Agent)
	add("org_id", f.OrgID)
	add("workspace_id", f.WorkspaceID)
	add("user_id", f.UserID)
	if !f.Since.IsZero() {
		args = append(args, f.Since)
		where = append(where, "r.created_at >= $"+strconv.Itoa(len(args)))
	}
	if !f.Until.IsZero() {
		args = append(args, f.Until)
		where = append(where, "r.created_at < $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + runColumns + ` FROM runs r`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, f.EffectiveLimit())
	q += ` ORDER BY r.created_at DESC, r.run_id DESC LIMIT $` + strconv.Itoa(len(args))
	return query(ctx, s.pool, "list runs", func(rows pgx.Rows) (store.Run, error) { return scanRun(rows) }, q, args...)
}

const callOrder = `ORDER BY seq ASC NULLS LAST, t_start ASC NULLS LAST, call_id ASC`

// ToolCalls implements Store.
func (s *Store) ToolCalls(ctx context.Context, runID string) ([]store.ToolCall, error) {
	return s.toolCalls(ctx, runID, "")
}

// toolCalls returns a run's calls, or only callID's when it is set.
func (s *Store) toolCalls(ctx context.Context, runID, callID string) ([]store.ToolCall, error) {
	return query(ctx, s.pool, fmt.Sprintf("tool calls of %q", runID), func(rows pgx.Rows) (store.ToolCall, error) {
		var (
			c                             store.ToolCall
			seq, iter                     *int32
			name, version, errCode, queue *string
			input, env                    []byte
		)
		if err := rows.Scan(&c.RunID, &c.CallID, &seq, &iter, &name, &version, &c.Status, &errCode,
			&input, &env, &c.TStart, &c.TEnd, &c.LatencyMS, &c.Cached, &c.Truncated, &queue, &c.Cost); err != nil {
			return c, err
		}
		c.Seq, c.Iteration = intPtr(seq), intPtr(iter)
		c.Name, c.Version, c.ErrorCode, c.Queue = deref(name), deref(version), deref(errCode), deref(queue)
		c.Input, c.Envelope = input, env
		c.TStart, c.TEnd = utcPtr(c.TStart), utcPtr(c.TEnd)
		return c, nil
	}, `SELECT run_id, call_id, seq, iteration, name, version, status, error_code,
		input, envelope, t_start, t_end, latency_ms, cached, truncated, queue, cost
		FROM tool_calls WHERE run_id = $1 AND ($2 = '' OR call_id = $2) `+callOrder, runID, callID)
}

// Envelopes implements Store.
func (s *Store) Envelopes(ctx context.Context, runID string) ([]json.RawMessage, error) {
	return query(ctx, s.pool, fmt.Sprintf("envelopes of %q", runID), func(rows pgx.Rows) (json.RawMessage, error) {
		var b []byte
		err := rows.Scan(&b)
		return b, err
	}, `SELECT envelope FROM tool_calls WHERE run_id = $1 AND envelope IS NOT NULL `+callOrder, runID)
}

// Events implements Store.
func (s *Store) Events(ctx context.Context, runID string) ([]store.EventRow, error) {
	return s.EventsAfter(ctx, runID, 0, 0)
}

// EventsAfter implements Store; a limit below 1 means no limit.
func (s *Store) EventsAfter(ctx context.Context, runID string, after int64, limit int) ([]store.EventRow, error) {
	// Writers of one run commit in seq order (lockRuns), so paging by seq
	// skips nothing.
	q := `SELECT seq, event_id, run_id, call_id, type, subject, source, time, stream,
		stream_seq, extensions, data, recorded_at FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq`
	args := []any{runID, after}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	return query(ctx, s.pool, fmt.Sprintf("events of %q", runID), func(rows pgx.Rows) (store.EventRow, error) {
		var (
			e                 store.EventRow
			run, call, stream *string
			seq               *int64
			exts, data        []byte
		)
		if err := rows.Scan(&e.Seq, &e.ID, &run, &call, &e.Type, &e.Subject, &e.Source, &e.Time, &stream,
			&seq, &exts, &data, &e.RecordedAt); err != nil {
			return e, err
		}
		e.RunID, e.CallID, e.Stream = deref(run), deref(call), deref(stream)
		if seq != nil {
			e.StreamSeq = uint64(*seq)
		}
		if len(exts) > 0 {
			if err := json.Unmarshal(exts, &e.Extensions); err != nil {
				return e, fmt.Errorf("extensions of %s: %w", e.ID, err)
			}
		}
		e.Data = data
		e.Time, e.RecordedAt = e.Time.UTC(), e.RecordedAt.UTC()
		return e, nil
	}, q, args...)
}

// ToolCall implements Store.
func (s *Store) ToolCall(ctx context.Context, runID, callID string) (store.ToolCall, error) {
	calls, err := s.toolCalls(ctx, runID, callID)
	return sqlstore.OneCall(runID, callID, calls, err)
}

// Turns implements Store.
func (s *Store) Turns(ctx context.Context, runID string) ([]store.TurnRow, error) {
	return query(ctx, s.pool, fmt.Sprintf("model turns of %q", runID), func(rows pgx.Rows) (store.TurnRow, error) {
		t := store.TurnRow{RunID: runID}
		var b []byte
		err := rows.Scan(&t.Iteration, &b)
		t.Turn = b
		return t, err
	}, `SELECT iteration, turn FROM model_turns WHERE run_id = $1 ORDER BY iteration`, runID)
}

// Verdicts implements Store.
func (s *Store) Verdicts(ctx context.Context, runID string) ([]store.VerdictRow, error) {
	return query(ctx, s.pool, fmt.Sprintf("verdicts of %q", runID), func(rows pgx.Rows) (store.VerdictRow, error) {
		v := store.VerdictRow{RunID: runID}
		var code, reason *string
		err := rows.Scan(&v.Iteration, &v.Allowed, &code, &reason)
		v.Code, v.Reason = deref(code), deref(reason)
		return v, err
	}, `SELECT iteration, allowed, code, reason FROM verdicts WHERE run_id = $1 ORDER BY iteration`, runID)
}

// RunTools implements Store.
func (s *Store) RunTools(ctx context.Context, runID string) ([]store.ToolDefRow, error) {
	return query(ctx, s.pool, fmt.Sprintf("tool definitions of %q", runID), func(rows pgx.Rows) (store.ToolDefRow, error) {
		d := store.ToolDefRow{RunID: runID}
		var b []byte
		err := rows.Scan(&d.Name, &d.Version, &b)
		d.Definition = b
		return d, err
	}, `SELECT name, version, definition FROM run_tools WHERE run_id = $1 ORDER BY name, version`, runID)
}

// CompletedRuns implements Store.
func (s *Store) CompletedRuns(ctx context.Context, tenant envelope.Tenant, agent string, before time.Time, limit int) ([]store.Run, error) {
	limit = max(limit, 1)
	return query(ctx, s.pool, "completed runs of "+tenant.ID()+" "+agent, func(rows pgx.Rows) (store.Run, error) {
		var outputs, pinned, blob []byte
		run, err := scanRun(rows, &outputs, &pinned, &blob)
		run.Outputs, run.Pinned, run.OutputsBlob = outputs, pinned, blob
		return run, err
	}, `SELECT `+runColumns+`, r.outputs, r.pinned, r.outputs_blob FROM runs r
		WHERE r.status = 'completed' AND r.org_id = $1 AND COALESCE(r.workspace_id, '') = $2
			AND COALESCE(r.user_id, '') = $3 AND r.agent = $4 AND r.created_at < $5
		ORDER BY r.created_at DESC, r.run_id DESC LIMIT $6`, tenant.OrgID, tenant.WorkspaceID, tenant.UserID, agent, before, limit)
}

// query runs a read, bounded by the read deadline unless ctx has one, and
// scans each row with scan; what names the read in its errors
// ("verdicts of \"run-1\"").
func query[T any](ctx context.Context, pool *pgxpool.Pool, what string, scan func(pgx.Rows) (T, error), sql string, args ...any) ([]T, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	return sqlstore.Collect(rows, what, scan)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func intPtr(v *int32) *int {
	if v == nil {
		return nil
	}
	n := int(*v)
	return &n
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
