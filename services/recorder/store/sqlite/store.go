// Package sqlite is the recorder's embedded store: store.Store on a SQLite
// file (modernc.org/sqlite, pure Go), what `toolwire dev` records into unless
// it is given a Postgres. One recorder process owns a file.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// Scheme starts a DATABASE_URL that names a SQLite file instead of a
// Postgres database: sqlite:<path> (sqlite:.toolwire/recorder.db,
// sqlite:///var/lib/toolwire/recorder.db).
const Scheme = "sqlite:"

// IsURL reports whether url names a SQLite database.
func IsURL(url string) bool { return strings.HasPrefix(url, Scheme) }

// URL returns the DATABASE_URL of the SQLite file at path.
func URL(path string) string { return Scheme + path }

// sqlitePath returns the file a sqlite: URL names.
func sqlitePath(url string) (string, error) {
	p := strings.TrimPrefix(url, Scheme)
	// sqlite:///abs/path and sqlite://rel/path, as URL-minded users write them.
	p = strings.TrimPrefix(p, "//")
	switch {
	case p == "":
		return "", errors.New(url + " names no file: want sqlite:<path>")
	case strings.ContainsAny(p, "?#\x00"):
		return "", fmt.Errorf("%q: a SQLite path must not hold '?', '#' or NUL", url)
	case p == ":memory:":
		return "", fmt.Errorf("%q: an in-memory database would lose every run at exit; name a file", url)
	}
	return filepath.Clean(p), nil
}

// timeLayout stores times as fixed-width UTC text, so that SQLite compares
// them in time order as strings.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// Store is the store.Store on a SQLite file: the embedded store of `toolwire
// dev`, for one recorder process. It keeps the same rules as postgres.Store
// (both pass storetest's contract suite); its
// writes are serialized by SQLite, each commit synced to disk before it
// returns (journal_mode WAL, synchronous FULL).
type Store struct {
	db   *sql.DB
	path string
}

// Open returns the store of the SQLite database that url (sqlite:<path>) or
// a plain path names. It does no I/O: the first query opens the file,
// creating it; Prepare creates its folder and Migrate its schema.
func Open(url string) (*Store, error) {
	path := url
	if IsURL(url) {
		p, err := sqlitePath(url)
		if err != nil {
			return nil, err
		}
		path = p
	}
	dsn := path + "?_busy_timeout=10000&_journal_mode=WAL&_synchronous=FULL&_foreign_keys=on&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// One writer at a time is SQLite's rule; a few readers serve the API
	// meanwhile (WAL lets them read while the writer writes).
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return &Store{db: db, path: path}, nil
}

// Prepare creates the database file's folder when missing, so that the first
// connection can create the file (Open does no I/O).
func (s *Store) Prepare() error {
	if err := os.MkdirAll(filepath.Dir(s.path), 0o750); err != nil {
		return fmt.Errorf("sqlite folder: %w", err)
	}
	return nil
}

// Path is the database file.
func (s *Store) Path() string { return s.path }

// DB is the database handle (migrations and tests use it).
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// classifySQLite marks errors that retrying cannot fix: a value too big for
// SQLite, or a constraint the data breaks.
func classifySQLite(err error) error {
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE:
			return fmt.Errorf("%w: %w", store.ErrUnstorable, err)
		}
	}
	return err
}

// Write implements Store.
func (s *Store) Write(ctx context.Context, recs ...store.Record) (err error) {
	if len(recs) == 0 {
		return nil
	}
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultWriteTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	news := make([]store.Record, 0, len(recs))
	for i := range recs {
		fresh, err := sqliteInsertEvent(ctx, tx, &recs[i].Event)
		if err != nil {
			return classifySQLite(fmt.Errorf("record event %q: %w", recs[i].Event.ID, err))
		}
		if fresh {
			news = append(news, recs[i])
		}
	}
	// The gate (store.Admit): what applies now, what waits for its run's
	// request or its call's turn, what never applies.
	adm, err := sqliteAdmit(ctx, tx, news)
	if err != nil {
		return err
	}
	for i := range adm.Apply {
		if err := sqliteApply(ctx, tx, &adm.Apply[i]); err != nil {
			return classifySQLite(fmt.Errorf("record event %q: %w", adm.Apply[i].Event.ID, err))
		}
	}
	if err := sqlitePark(ctx, tx, adm); err != nil {
		return classifySQLite(err)
	}
	if err := tx.Commit(); err != nil {
		return classifySQLite(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// sqliteInsertEvent inserts an event's row and reports whether it is new (a
// redelivered event is recorded already, with its effects).
func sqliteInsertEvent(ctx context.Context, tx *sql.Tx, e *store.EventRow) (bool, error) {
	var exts *string
	if len(e.Extensions) > 0 {
		b, err := json.Marshal(e.Extensions)
		if err != nil {
			return false, err
		}
		v := string(b)
		exts = &v
	}
	var seq *int64
	if e.StreamSeq > 0 {
		v := int64(e.StreamSeq)
		seq = &v
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO events (event_id, run_id, call_id, type, subject, source, time,
		stream, stream_seq, extensions, data, recorded_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
		ON CONFLICT DO NOTHING`, // events_run_event_idx: (coalesce(run_id, ''), event_id)
		e.ID, sqlstore.NullString(e.RunID), sqlstore.NullString(e.CallID), e.Type, e.Subject, e.Source, fmtTime(e.Time),
		sqlstore.NullString(e.Stream), seq, exts, sqlstore.JSONText(e.Data), fmtTime(time.Now()))
	if err != nil {
		return false, fmt.Errorf("insert event: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n > 0, nil
}

// sqliteApply applies a new record's effects.
func sqliteApply(ctx context.Context, tx *sql.Tx, r *store.Record) error {
	if r.Run != nil {
		if err := sqliteUpsertRun(ctx, tx, r.Run); err != nil {
			return err
		}
	}
	for i := range r.Calls {
		if err := sqliteUpsertCall(ctx, tx, &r.Calls[i]); err != nil {
			return err
		}
	}
	if t := r.Turn; t != nil {
		if _, err := tx.ExecContext(ctx, `INSERT INTO model_turns (run_id, iteration, turn) VALUES (?1, ?2, ?3)
			ON CONFLICT (run_id, iteration) DO NOTHING`, t.RunID, t.Iteration, sqlstore.JSONText(t.Turn)); err != nil {
			return fmt.Errorf("insert model turn: %w", err)
		}
	}
	if v := r.Verdict; v != nil {
		if _, err := tx.ExecContext(ctx, `INSERT INTO verdicts (run_id, iteration, allowed, code, reason)
			VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (run_id, iteration) DO NOTHING`,
			v.RunID, v.Iteration, v.Allowed, sqlstore.NullString(v.Code), sqlstore.NullString(v.Reason)); err != nil {
			return fmt.Errorf("insert verdict: %w", err)
		}
	}
	for _, d := range r.Tools {
		if _, err := tx.ExecContext(ctx, `INSERT INTO run_tools (run_id, name, version, definition)
			VALUES (?1, ?2, ?3, ?4) ON CONFLICT (run_id, name, version) DO NOTHING`,
			d.RunID, d.Name, d.Version, sqlstore.JSONText(d.Definition)); err != nil {
			return fmt.Errorf("insert tool definition: %w", err)
		}
	}
	return nil
}

// sqliteUpsertRunSQL is the one-update run upsert (the reference statement
// kept in postgres_runs_test.go) in SQLite's dialect: max/min for
// GREATEST/LEAST (which ignore NULLs in Postgres: spend says so explicitly).
var sqliteUpsertRunSQL = func() string {
	wins := "(?16 AND " + sqlstore.StatusWins("excluded.status", "excluded.status_at", "r.status", "r.status_at") + ")"
	takeTenant := "(excluded.org_id IS NOT NULL AND (excluded.request IS NOT NULL OR r.org_id IS NULL))"
	takeAgent := "(excluded.agent IS NOT NULL AND (excluded.request IS NOT NULL OR r.agent IS NULL))"
	return `
INSERT INTO runs AS r (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason,
	outputs, pinned, trace_id, iterations, tool_calls, created_at, updated_at, completed_at, spend, outputs_blob)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?7, ?7, ?15, ?17, ?18)
ON CONFLICT (run_id) DO UPDATE SET
` + sqlstore.RunTakeSet("excluded", takeTenant, takeAgent, wins) + `	request      = COALESCE(r.request, excluded.request),
	outputs      = COALESCE(r.outputs, excluded.outputs),
	pinned       = COALESCE(r.pinned, excluded.pinned),
	outputs_blob = COALESCE(r.outputs_blob, excluded.outputs_blob),
	trace_id     = COALESCE(r.trace_id, excluded.trace_id),
	iterations   = max(r.iterations, excluded.iterations),
	tool_calls   = max(r.tool_calls, excluded.tool_calls),
	spend        = CASE WHEN r.spend IS NULL THEN excluded.spend
	                    WHEN excluded.spend IS NULL THEN r.spend
	                    ELSE max(r.spend, excluded.spend) END,
	created_at   = min(r.created_at, excluded.created_at),
	updated_at   = max(r.updated_at, excluded.updated_at)`
}()

func sqliteUpsertRun(ctx context.Context, tx *sql.Tx, u *store.RunUpdate) error {
	status, hasStatus := u.Status, u.Status != ""
	if !hasStatus {
		status = store.StatusRequested
	}
	var completedAt *string
	if store.IsTerminal(status) {
		t := fmtTime(u.At)
		completedAt = &t
	}
	var ws, user *string
	if u.Tenant.OrgID != "" {
		ws, user = &u.Tenant.WorkspaceID, &u.Tenant.UserID
	}
	_, err := tx.ExecContext(ctx, sqliteUpsertRunSQL,
		u.RunID, sqlstore.NullString(u.Tenant.OrgID), ws, user, sqlstore.NullString(u.Agent), status, fmtTime(u.At),
		sqlstore.JSONText(u.Request), sqlstore.NullString(u.Reason), sqlstore.JSONText(u.Outputs), sqlstore.JSONText(u.Pinned),
		sqlstore.NullString(u.TraceID), u.Iterations, u.ToolCalls, completedAt, hasStatus, u.Spend, sqlstore.JSONText(u.OutputsBlob))
	if err != nil {
		return fmt.Errorf("upsert run: %w", err)
	}
	return nil
}

// sqliteUpsertCallSQL applies one CallUpdate by the rules of sqlstore.CallUpsertSet.
var sqliteUpsertCallSQL = `
INSERT INTO tool_calls AS c (run_id, call_id, seq, iteration, name, version, status, error_code, input,
	envelope, t_start, t_end, latency_ms, cached, truncated, queue, cost)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
ON CONFLICT (run_id, call_id) DO UPDATE SET` + sqlstore.CallUpsertSet

func sqliteUpsertCall(ctx context.Context, tx *sql.Tx, u *store.CallUpdate) error {
	_, err := tx.ExecContext(ctx, sqliteUpsertCallSQL,
		u.RunID, u.CallID, u.Seq, u.Iteration, sqlstore.NullString(u.Name), sqlstore.NullString(u.Version), u.Status,
		sqlstore.NullString(u.ErrorCode), sqlstore.JSONText(u.Input), sqlstore.JSONText(u.Envelope), fmtTimePtr(u.TStart),
		fmtTimePtr(u.TEnd), u.LatencyMS, u.Cached, u.Truncated, sqlstore.NullString(u.Queue), u.Cost)
	if err != nil {
		return fmt.Errorf("upsert tool call: %w", err)
	}
	return nil
}

const sqliteRunColumns = `r.run_id, r.org_id, r.workspace_id, r.user_id, r.agent, r.status, r.reason, r.trace_id,
	r.iterations, max(r.tool_calls, (SELECT count(*) FROM tool_calls tc WHERE tc.run_id = r.run_id)),
	r.created_at, r.updated_at, r.completed_at, r.spend`

type scanner interface{ Scan(dest ...any) error }

func sqliteScanRun(row scanner, extra ...any) (store.Run, error) {
	var (
		run                          store.Run
		org, ws, user, agent, reason sql.NullString
		traceID, completedAt         sql.NullString
		created, updated             string
		spend                        sql.NullFloat64
	)
	dest := []any{&run.RunID, &org, &ws, &user, &agent, &run.Status, &reason, &traceID,
		&run.Iterations, &run.ToolCalls, &created, &updated, &completedAt, &spend}
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return store.Run{}, err
	}
	run.Tenant.OrgID, run.Tenant.WorkspaceID, run.Tenant.UserID = org.String, ws.String, user.String
	run.Agent, run.Reason, run.TraceID = agent.String, reason.String, traceID.String
	var err error
	if run.CreatedAt, err = parseTime(created); err != nil {
		return store.Run{}, err
	}
	if run.UpdatedAt, err = parseTime(updated); err != nil {
		return store.Run{}, err
	}
	if run.CompletedAt, err = parseTimeNull(completedAt); err != nil {
		return store.Run{}, err
	}
	if spend.Valid {
		v := spend.Float64
		run.Spend = &v
	}
	return run, nil
}

// Run implements Store.
func (s *Store) Run(ctx context.Context, runID string) (store.Run, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	var req, outputs, pinned, blob sql.NullString
	run, err := sqliteScanRun(s.db.QueryRowContext(ctx, `SELECT `+sqliteRunColumns+`, r.request, r.outputs, r.pinned, r.outputs_blob
		FROM runs r WHERE r.run_id = ?1`, runID), &req, &outputs, &pinned, &blob)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Run{}, fmt.Errorf("%w: %q", store.ErrRunNotFound, runID)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("get run %q: %w", runID, err)
	}
	run.Request, run.Outputs, run.Pinned, run.OutputsBlob = rawJSON(req), rawJSON(outputs), rawJSON(pinned), rawJSON(blob)
	return run, nil
}

// ListRuns implements Store.
func (s *Store) ListRuns(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	var (
		where []string
		args  []any
	)
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "?"+strconv.Itoa(len(args))))
	}
	for col, v := range map[string]string{"status": f.Status, "agent": f.Agent, "org_id": f.OrgID,
		"workspace_id": f.WorkspaceID, "user_id": f.UserID} {
		if v != "" {
			add("r."+col+" = ?", v)
		}
	}
	if !f.Since.IsZero() {
		add("r.created_at >= ?", fmtTime(f.Since))
	}
	if !f.Until.IsZero() {
		add("r.created_at < ?", fmtTime(f.Until))
	}
	q := `SELECT ` + sqliteRunColumns + ` FROM runs r`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, f.EffectiveLimit())
	q += ` ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?` + strconv.Itoa(len(args)) //nolint:gosec // G202: only placeholders are joined; every value is bound
	return query(ctx, s.db, "list runs", func(rows *sql.Rows) (store.Run, error) { return sqliteScanRun(rows) }, q, args...)
}

// CompletedRuns implements Store.
func (s *Store) CompletedRuns(ctx context.Context, tenant envelope.Tenant, agent string, before time.Time, limit int) ([]store.Run, error) {
	limit = max(limit, 1)
	return query(ctx, s.db, "completed runs of "+tenant.ID()+" "+agent, func(rows *sql.Rows) (store.Run, error) {
		var outputs, pinned, blob sql.NullString
		run, err := sqliteScanRun(rows, &outputs, &pinned, &blob)
		run.Outputs, run.Pinned, run.OutputsBlob = rawJSON(outputs), rawJSON(pinned), rawJSON(blob)
		return run, err
	}, `SELECT `+sqliteRunColumns+`, r.outputs, r.pinned, r.outputs_blob FROM runs r
		WHERE r.status = 'completed' AND r.org_id = ?1 AND COALESCE(r.workspace_id, '') = ?2
			AND COALESCE(r.user_id, '') = ?3 AND r.agent = ?4 AND r.created_at < ?5
		ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?6`, tenant.OrgID, tenant.WorkspaceID, tenant.UserID, agent, fmtTime(before), limit)
}

const sqliteCallOrder = `ORDER BY seq IS NULL, seq, t_start IS NULL, t_start, call_id`

// ToolCalls implements Store.
func (s *Store) ToolCalls(ctx context.Context, runID string) ([]store.ToolCall, error) {
	return s.toolCalls(ctx, runID, "")
}

// ToolCall implements Store.
func (s *Store) ToolCall(ctx context.Context, runID, callID string) (store.ToolCall, error) {
	calls, err := s.toolCalls(ctx, runID, callID)
	return sqlstore.OneCall(runID, callID, calls, err)
}

func (s *Store) toolCalls(ctx context.Context, runID, callID string) ([]store.ToolCall, error) {
	return query(ctx, s.db, fmt.Sprintf("tool calls of %q", runID), func(rows *sql.Rows) (store.ToolCall, error) {
		var (
			c                             store.ToolCall
			seq, iter, latency            sql.NullInt64
			name, version, errCode, queue sql.NullString
			input, env                    sql.NullString
			tStart, tEnd                  sql.NullString
			cost                          sql.NullFloat64
		)
		err := rows.Scan(&c.RunID, &c.CallID, &seq, &iter, &name, &version, &c.Status, &errCode,
			&input, &env, &tStart, &tEnd, &latency, &c.Cached, &c.Truncated, &queue, &cost)
		if err != nil {
			return c, err
		}
		c.Seq, c.Iteration = nullInt(seq), nullInt(iter)
		if latency.Valid {
			v := latency.Int64
			c.LatencyMS = &v
		}
		if cost.Valid {
			v := cost.Float64
			c.Cost = &v
		}
		c.Name, c.Version, c.ErrorCode, c.Queue = name.String, version.String, errCode.String, queue.String
		c.Input, c.Envelope = rawJSON(input), rawJSON(env)
		if c.TStart, err = parseTimeNull(tStart); err != nil {
			return c, err
		}
		c.TEnd, err = parseTimeNull(tEnd)
		return c, err
	}, `SELECT run_id, call_id, seq, iteration, name, version, status, error_code,
		input, envelope, t_start, t_end, latency_ms, cached, truncated, queue, cost
		FROM tool_calls WHERE run_id = ?1 AND (?2 = '' OR call_id = ?2) `+sqliteCallOrder, runID, callID)
}

// Envelopes implements Store.
func (s *Store) Envelopes(ctx context.Context, runID string) ([]json.RawMessage, error) {
	return query(ctx, s.db, fmt.Sprintf("envelopes of %q", runID), func(rows *sql.Rows) (json.RawMessage, error) {
		var b string
		err := rows.Scan(&b)
		return json.RawMessage(b), err
	}, `SELECT envelope FROM tool_calls
		WHERE run_id = ?1 AND envelope IS NOT NULL `+sqliteCallOrder, runID)
}

// Events implements Store.
func (s *Store) Events(ctx context.Context, runID string) ([]store.EventRow, error) {
	return s.EventsAfter(ctx, runID, 0, 0)
}

// EventsAfter implements Store; a limit below 1 means no limit.
func (s *Store) EventsAfter(ctx context.Context, runID string, after int64, limit int) ([]store.EventRow, error) {
	if limit < 1 {
		limit = -1 // SQLite: no limit
	}
	return query(ctx, s.db, fmt.Sprintf("events of %q", runID), func(rows *sql.Rows) (store.EventRow, error) {
		var (
			e                 store.EventRow
			run, call, stream sql.NullString
			seq               sql.NullInt64
			exts, data        sql.NullString
			evTime, recorded  string
		)
		err := rows.Scan(&e.Seq, &e.ID, &run, &call, &e.Type, &e.Subject, &e.Source, &evTime, &stream,
			&seq, &exts, &data, &recorded)
		if err != nil {
			return e, err
		}
		e.RunID, e.CallID, e.Stream = run.String, call.String, stream.String
		if seq.Valid {
			e.StreamSeq = uint64(seq.Int64)
		}
		if exts.Valid {
			if err := json.Unmarshal([]byte(exts.String), &e.Extensions); err != nil {
				return e, fmt.Errorf("extensions of %s: %w", e.ID, err)
			}
		}
		e.Data = rawJSON(data)
		if e.Time, err = parseTime(evTime); err != nil {
			return e, err
		}
		e.RecordedAt, err = parseTime(recorded)
		return e, err
	}, `SELECT seq, event_id, run_id, call_id, type, subject, source, time, stream,
		stream_seq, extensions, data, recorded_at FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3`,
		runID, after, limit)
}

// Turns implements Store.
func (s *Store) Turns(ctx context.Context, runID string) ([]store.TurnRow, error) {
	return query(ctx, s.db, fmt.Sprintf("model turns of %q", runID), func(rows *sql.Rows) (store.TurnRow, error) {
		t := store.TurnRow{RunID: runID}
		var b string
		err := rows.Scan(&t.Iteration, &b)
		t.Turn = json.RawMessage(b)
		return t, err
	}, `SELECT iteration, turn FROM model_turns WHERE run_id = ?1 ORDER BY iteration`, runID)
}

// Verdicts implements Store.
func (s *Store) Verdicts(ctx context.Context, runID string) ([]store.VerdictRow, error) {
	return query(ctx, s.db, fmt.Sprintf("verdicts of %q", runID), func(rows *sql.Rows) (store.VerdictRow, error) {
		v := store.VerdictRow{RunID: runID}
		var code, reason sql.NullString
		err := rows.Scan(&v.Iteration, &v.Allowed, &code, &reason)
		v.Code, v.Reason = code.String, reason.String
		return v, err
	}, `SELECT iteration, allowed, code, reason FROM verdicts WHERE run_id = ?1
		ORDER BY iteration`, runID)
}

// RunTools implements Store.
func (s *Store) RunTools(ctx context.Context, runID string) ([]store.ToolDefRow, error) {
	return query(ctx, s.db, fmt.Sprintf("tool definitions of %q", runID), func(rows *sql.Rows) (store.ToolDefRow, error) {
		d := store.ToolDefRow{RunID: runID}
		var b string
		err := rows.Scan(&d.Name, &d.Version, &b)
		d.Definition = json.RawMessage(b)
		return d, err
	}, `SELECT name, version, definition FROM run_tools WHERE run_id = ?1
		ORDER BY name, version`, runID)
}

func fmtTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func fmtTimePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := fmtTime(*t)
	return &s
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t.UTC(), nil
}

func parseTimeNull(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := parseTime(s.String)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

func rawJSON(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return nil
	}
	return json.RawMessage(s.String)
}

// query runs a read, bounded by the read deadline unless ctx has one, and
// scans each row with scan; what names the read in its errors
// ("verdicts of \"run-1\"").
func query[T any](ctx context.Context, db *sql.DB, what string, scan func(*sql.Rows) (T, error), q string, args ...any) ([]T, error) {
	ctx, cancel := sqlstore.WithTimeout(ctx, store.DefaultReadTimeout)
	defer cancel()
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = rows.Close() }()
	return sqlstore.Collect(rows, what, scan)
}

func nullInt(v sql.NullInt64) *int {
	if !v.Valid {
		return nil
	}
	n := int(v.Int64)
	return &n
}
