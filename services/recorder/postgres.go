package recorder

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
)

// Default deadlines of the store's calls when the caller set none.
const (
	defaultWriteTimeout = 30 * time.Second
	defaultReadTimeout  = 10 * time.Second
)

// PostgresStore is the Store on Postgres. Its tables live in the search_path of
// the pool's connections; Migrate creates them.
type PostgresStore struct {
	pool *pgxpool.Pool
}

// NewPostgresStore returns a store on pool. The caller owns the pool.
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore { return &PostgresStore{pool: pool} }

// NewPool returns a pool for dsn (a URL or keyword/value string; a
// search_path parameter selects the schema). It does not connect: the first
// query does.
func NewPool(dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors can quote the connection string, password and all.
		return nil, errors.New("recorder: " + EnvDatabaseURL + " is not a valid Postgres connection string")
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("recorder: postgres pool: %w", err)
	}
	return pool, nil
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// classify marks errors that retrying cannot fix: Postgres's data exceptions
// (class 22: \u0000 in jsonb, invalid UTF-8, a value out of range) and
// program limits (class 54: a document too large).
func classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54")) {
		return fmt.Errorf("%w: %w", ErrUnstorable, err)
	}
	return err
}

// Write implements Store.
func (s *PostgresStore) Write(ctx context.Context, recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	ctx, cancel := withTimeout(ctx, defaultWriteTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return writeRecords(ctx, tx, recs) })
	return classify(err)
}

// writeRecords writes a batch in two pipelined round trips instead of a few
// per record: first every event row (INSERT ... ON CONFLICT DO NOTHING, in
// order, so a duplicate, stored before or earlier in the batch, inserts
// nothing), then the effects of the records whose event row is new, in the
// same order. It is the same statements as writing the records one by one in
// the transaction: the effects touch no events row, so running them after
// all the inserts changes nothing, and the transaction still commits an
// event with all its effects or nothing.
func writeRecords(ctx context.Context, tx pgx.Tx, recs []Record) error {
	b := &pgx.Batch{}
	for i := range recs {
		args, err := eventArgs(&recs[i])
		if err != nil {
			return fmt.Errorf("record event %q: %w", recs[i].Event.ID, err)
		}
		b.Queue(insertEventSQL, args...)
	}
	fresh := make([]bool, len(recs))
	err := sendBatch(ctx, tx, b, func(i int, tag pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("record event %q: insert event: %w", recs[i].Event.ID, err)
		}
		fresh[i] = tag.RowsAffected() > 0
		return nil
	})
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	var owner []int // owner[k]: the record of the k-th queued effect
	for i := range recs {
		if !fresh[i] {
			continue // recorded before, with its effects
		}
		for _, q := range effects(&recs[i]) {
			b.Queue(q.sql, q.args...)
			owner = append(owner, i)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return sendBatch(ctx, tx, b, func(k int, _ pgconn.CommandTag, err error) error {
		if err != nil {
			r := &recs[owner[k]]
			return fmt.Errorf("record event %q: %s: %w", r.Event.ID, effectName(b.QueuedQueries[k].SQL), err)
		}
		return nil
	})
}

// sendBatch sends b in one round trip and hands each statement's result to
// check, in order; the first error ends it.
func sendBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, check func(i int, tag pgconn.CommandTag, err error) error) error {
	br := tx.SendBatch(ctx, b)
	for i := range b.Len() {
		tag, err := br.Exec()
		if err := check(i, tag, err); err != nil {
			_ = br.Close()
			return err
		}
	}
	return br.Close()
}

// query is one statement and its arguments.
type query struct {
	sql  string
	args []any
}

// effects are the statements that materialize a new event: its run, call,
// model turn, verdict and tool definitions.
func effects(r *Record) []query {
	var qs []query
	if r.Run != nil {
		qs = append(qs, query{upsertRunSQL, runArgs(r.Run)})
	}
	if u := r.Call; u != nil {
		qs = append(qs, query{upsertCallSQL, []any{u.RunID, u.CallID, u.Seq, u.Iteration, nullString(u.Name),
			nullString(u.Version), u.Status, nullString(u.ErrorCode), nullJSON(u.Input), nullJSON(u.Envelope),
			u.TStart, u.TEnd, u.LatencyMS, u.Cached, u.Truncated}})
	}
	if t := r.Turn; t != nil {
		qs = append(qs, query{insertTurnSQL, []any{t.RunID, t.Iteration, nullJSON(t.Turn)}})
	}
	if v := r.Verdict; v != nil {
		qs = append(qs, query{insertVerdictSQL, []any{v.RunID, v.Iteration, v.Allowed, nullString(v.Code), nullString(v.Reason)}})
	}
	for _, d := range r.Tools {
		qs = append(qs, query{insertRunToolSQL, []any{d.RunID, d.Name, d.Version, nullJSON(d.Definition)}})
	}
	return qs
}

// effectName names an effect's statement in an error, as writeRecord does.
func effectName(sql string) string {
	switch sql {
	case upsertRunSQL:
		return "upsert run"
	case upsertCallSQL:
		return "upsert tool call"
	case insertTurnSQL:
		return "insert model turn"
	case insertVerdictSQL:
		return "insert verdict"
	}
	return "insert tool definition"
}

const (
	insertTurnSQL = `INSERT INTO model_turns (run_id, iteration, turn) VALUES ($1, $2, $3)
			ON CONFLICT (run_id, iteration) DO NOTHING`
	insertVerdictSQL = `INSERT INTO verdicts (run_id, iteration, allowed, code, reason) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (run_id, iteration) DO NOTHING`
	insertRunToolSQL = `INSERT INTO run_tools (run_id, name, version, definition) VALUES ($1, $2, $3, $4)
			ON CONFLICT (run_id, name, version) DO NOTHING`
)

// eventArgs are insertEventSQL's arguments for r.
func eventArgs(r *Record) ([]any, error) {
	e := &r.Event
	var exts json.RawMessage
	if len(e.Extensions) > 0 {
		b, err := json.Marshal(e.Extensions)
		if err != nil {
			return nil, err
		}
		exts = b
	}
	var seq *int64
	if e.StreamSeq > 0 {
		v := int64(e.StreamSeq)
		seq = &v
	}
	return []any{e.ID, nullString(e.RunID), nullString(e.CallID), e.Type,
		e.Subject, e.Source, e.Time, nullString(e.Stream), seq, exts, nullJSON(e.Data)}, nil
}

const insertEventSQL = `
INSERT INTO events (event_id, run_id, call_id, type, subject, source, time, stream, stream_seq, extensions, data)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (event_id) DO NOTHING`

// rankSQL renders a CASE expression ranking expr as rank does for statuses.
func rankSQL(expr string, statuses []string, rank func(string) int) string {
	var b strings.Builder
	b.WriteString("(CASE " + expr)
	for _, s := range statuses {
		b.WriteString(" WHEN '" + s + "' THEN " + strconv.Itoa(rank(s)))
	}
	b.WriteString(" ELSE -1 END)")
	return b.String()
}

func callStatuses() []string {
	return []string{CallRequested, CallApproved, CallStarted, CallCompleted}
}

// upsertRunSQL applies a RunUpdate. $16 says whether the update carries a
// status; the status wins when its (rank, time, name) is greater than the
// stored one's, and reason and completed_at follow it.
var upsertRunSQL = func() string {
	wins := "($16::boolean AND (" + rankSQL("EXCLUDED.status", RunStatuses(), RunStatusRank) +
		", EXCLUDED.status_at, EXCLUDED.status) > (" + rankSQL("r.status", RunStatuses(), RunStatusRank) +
		", r.status_at, r.status))"
	// A run request's tenant and agent win; otherwise the first event that
	// names them does.
	takeTenant := "(EXCLUDED.org_id IS NOT NULL AND (EXCLUDED.request IS NOT NULL OR r.org_id IS NULL))"
	takeAgent := "(EXCLUDED.agent IS NOT NULL AND (EXCLUDED.request IS NOT NULL OR r.agent IS NULL))"
	return `
INSERT INTO runs AS r (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason,
	outputs, pinned, trace_id, iterations, tool_calls, created_at, updated_at, completed_at, spend)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $7, $7, $15, $17)
ON CONFLICT (run_id) DO UPDATE SET
	org_id       = CASE WHEN ` + takeTenant + ` THEN EXCLUDED.org_id ELSE r.org_id END,
	workspace_id = CASE WHEN ` + takeTenant + ` THEN EXCLUDED.workspace_id ELSE r.workspace_id END,
	user_id      = CASE WHEN ` + takeTenant + ` THEN EXCLUDED.user_id ELSE r.user_id END,
	agent        = CASE WHEN ` + takeAgent + ` THEN EXCLUDED.agent ELSE r.agent END,
	status       = CASE WHEN ` + wins + ` THEN EXCLUDED.status ELSE r.status END,
	status_at    = CASE WHEN ` + wins + ` THEN EXCLUDED.status_at ELSE r.status_at END,
	reason       = CASE WHEN ` + wins + ` THEN EXCLUDED.reason ELSE r.reason END,
	completed_at = CASE WHEN ` + wins + ` THEN EXCLUDED.completed_at ELSE r.completed_at END,
	request      = COALESCE(r.request, EXCLUDED.request),
	outputs      = COALESCE(r.outputs, EXCLUDED.outputs),
	pinned       = COALESCE(r.pinned, EXCLUDED.pinned),
	trace_id     = COALESCE(r.trace_id, EXCLUDED.trace_id),
	iterations   = GREATEST(r.iterations, EXCLUDED.iterations),
	tool_calls   = GREATEST(r.tool_calls, EXCLUDED.tool_calls),
	spend        = GREATEST(r.spend, EXCLUDED.spend),
	created_at   = LEAST(r.created_at, EXCLUDED.created_at),
	updated_at   = GREATEST(r.updated_at, EXCLUDED.updated_at)`
}()

// runArgs are upsertRunSQL's arguments for u.
func runArgs(u *RunUpdate) []any {
	status, hasStatus := u.Status, u.Status != ""
	if !hasStatus {
		status = StatusRequested // only for a new row: the least status
	}
	var completedAt *time.Time
	if IsTerminal(status) {
		t := u.At
		completedAt = &t
	}
	var ws, user *string
	if u.Tenant.OrgID != "" {
		ws, user = &u.Tenant.WorkspaceID, &u.Tenant.UserID
	}
	return []any{u.RunID, nullString(u.Tenant.OrgID), ws, user, nullString(u.Agent), status, u.At,
		nullJSON(u.Request), nullString(u.Reason), nullJSON(u.Outputs), nullJSON(u.Pinned),
		nullString(u.TraceID), u.Iterations, u.ToolCalls, completedAt, hasStatus, u.Spend}
}

// upsertCallSQL applies a CallUpdate. The status moves forward only. Until the
// envelope arrives, the first event that names a field sets it; the envelope
// then overrides name, version, input and t_start, and alone sets the rest.
var upsertCallSQL = func() string {
	fwd := rankSQL("EXCLUDED.status", callStatuses(), CallStatusRank) + " > " + rankSQL("c.status", callStatuses(), CallStatusRank)
	newEnv := "(c.envelope IS NULL AND EXCLUDED.envelope IS NOT NULL)"
	shared := func(col string) string {
		return col + " = CASE WHEN " + newEnv + " THEN COALESCE(EXCLUDED." + col + ", c." + col + ") ELSE COALESCE(c." + col + ", EXCLUDED." + col + ") END"
	}
	fromEnv := func(col string) string {
		return col + " = CASE WHEN " + newEnv + " THEN EXCLUDED." + col + " ELSE c." + col + " END"
	}
	return `
INSERT INTO tool_calls AS c (run_id, call_id, seq, iteration, name, version, status, error_code, input,
	envelope, t_start, t_end, latency_ms, cached, truncated)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (run_id, call_id) DO UPDATE SET
	status    = CASE WHEN ` + fwd + ` THEN EXCLUDED.status ELSE c.status END,
	seq       = COALESCE(c.seq, EXCLUDED.seq),
	iteration = COALESCE(c.iteration, EXCLUDED.iteration),
	` + shared("name") + `,
	` + shared("version") + `,
	` + shared("input") + `,
	` + shared("t_start") + `,
	` + fromEnv("error_code") + `,
	` + fromEnv("t_end") + `,
	` + fromEnv("latency_ms") + `,
	` + fromEnv("cached") + `,
	` + fromEnv("truncated") + `,
	envelope  = COALESCE(c.envelope, EXCLUDED.envelope)`
}()

const runColumns = `r.run_id, r.org_id, r.workspace_id, r.user_id, r.agent, r.status, r.reason, r.trace_id,
	r.iterations, GREATEST(r.tool_calls, (SELECT count(*) FROM tool_calls tc WHERE tc.run_id = r.run_id))::integer,
	r.created_at, r.updated_at, r.completed_at, r.spend`

func scanRun(row pgx.Row, extra ...any) (Run, error) {
	var (
		run                          Run
		org, ws, user, agent, reason *string
		traceID                      *string
		completedAt                  *time.Time
		dest                         []any
	)
	dest = append(dest, &run.RunID, &org, &ws, &user, &agent, &run.Status, &reason, &traceID,
		&run.Iterations, &run.ToolCalls, &run.CreatedAt, &run.UpdatedAt, &completedAt, &run.Spend)
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return Run{}, err
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
func (s *PostgresStore) Run(ctx context.Context, runID string) (Run, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	var req, outputs, pinned []byte
	run, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+runColumns+`, r.request, r.outputs, r.pinned
		FROM runs r WHERE r.run_id = $1`, runID), &req, &outputs, &pinned)
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, fmt.Errorf("%w: %q", ErrRunNotFound, runID)
	}
	if err != nil {
		return Run{}, fmt.Errorf("get run %q: %w", runID, err)
	}
	run.Request, run.Outputs, run.Pinned = req, outputs, pinned
	return run, nil
}

// ListRuns implements Store. The runs it returns carry no Request, Outputs or
// Pinned: read one run for those.
func (s *PostgresStore) ListRuns(ctx context.Context, f RunFilter) ([]Run, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
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
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	out := []Run{}
	for rows.Next() {
		run, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		out = append(out, run)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

const callOrder = `ORDER BY seq ASC NULLS LAST, t_start ASC NULLS LAST, call_id ASC`

// ToolCalls implements Store.
func (s *PostgresStore) ToolCalls(ctx context.Context, runID string) ([]ToolCall, error) {
	return s.toolCalls(ctx, runID, "")
}

// toolCalls returns a run's calls, or only callID's when it is set.
func (s *PostgresStore) toolCalls(ctx context.Context, runID, callID string) ([]ToolCall, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT run_id, call_id, seq, iteration, name, version, status, error_code,
		input, envelope, t_start, t_end, latency_ms, cached, truncated
		FROM tool_calls WHERE run_id = $1 AND ($2 = '' OR call_id = $2) `+callOrder, runID, callID)
	if err != nil {
		return nil, fmt.Errorf("tool calls of %q: %w", runID, err)
	}
	defer rows.Close()
	out := []ToolCall{}
	for rows.Next() {
		var (
			c                      ToolCall
			seq, iter              *int32
			name, version, errCode *string
			input, env             []byte
		)
		if err := rows.Scan(&c.RunID, &c.CallID, &seq, &iter, &name, &version, &c.Status, &errCode,
			&input, &env, &c.TStart, &c.TEnd, &c.LatencyMS, &c.Cached, &c.Truncated); err != nil {
			return nil, fmt.Errorf("tool calls of %q: %w", runID, err)
		}
		c.Seq, c.Iteration = intPtr(seq), intPtr(iter)
		c.Name, c.Version, c.ErrorCode = deref(name), deref(version), deref(errCode)
		c.Input, c.Envelope = input, env
		c.TStart, c.TEnd = utcPtr(c.TStart), utcPtr(c.TEnd)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tool calls of %q: %w", runID, err)
	}
	return out, nil
}

// Envelopes implements Store.
func (s *PostgresStore) Envelopes(ctx context.Context, runID string) ([]json.RawMessage, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT envelope FROM tool_calls
		WHERE run_id = $1 AND envelope IS NOT NULL `+callOrder, runID)
	if err != nil {
		return nil, fmt.Errorf("envelopes of %q: %w", runID, err)
	}
	defer rows.Close()
	out := []json.RawMessage{}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("envelopes of %q: %w", runID, err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("envelopes of %q: %w", runID, err)
	}
	return out, nil
}

// Events implements Store.
func (s *PostgresStore) Events(ctx context.Context, runID string) ([]EventRow, error) {
	return s.EventsAfter(ctx, runID, 0, 0)
}

// EventsAfter implements Store; a limit below 1 means no limit.
func (s *PostgresStore) EventsAfter(ctx context.Context, runID string, after int64, limit int) ([]EventRow, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	// Only events whose transaction is older than every one still running:
	// a concurrent recorder's commit can still add an event with a lower
	// seq than those already visible (see migration 00002).
	q := `SELECT seq, event_id, run_id, call_id, type, subject, source, time, stream,
		stream_seq, extensions, data, recorded_at FROM events WHERE run_id = $1 AND seq > $2
		AND (txid IS NULL OR txid < pg_snapshot_xmin(pg_current_snapshot())) ORDER BY seq`
	args := []any{runID, after}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("events of %q: %w", runID, err)
	}
	defer rows.Close()
	out := []EventRow{}
	for rows.Next() {
		var (
			e                 EventRow
			run, call, stream *string
			seq               *int64
			exts, data        []byte
		)
		if err := rows.Scan(&e.Seq, &e.ID, &run, &call, &e.Type, &e.Subject, &e.Source, &e.Time, &stream,
			&seq, &exts, &data, &e.RecordedAt); err != nil {
			return nil, fmt.Errorf("events of %q: %w", runID, err)
		}
		e.RunID, e.CallID, e.Stream = deref(run), deref(call), deref(stream)
		if seq != nil {
			e.StreamSeq = uint64(*seq)
		}
		if len(exts) > 0 {
			if err := json.Unmarshal(exts, &e.Extensions); err != nil {
				return nil, fmt.Errorf("events of %q: extensions of %s: %w", runID, e.ID, err)
			}
		}
		e.Data = data
		e.Time, e.RecordedAt = e.Time.UTC(), e.RecordedAt.UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events of %q: %w", runID, err)
	}
	return out, nil
}

// ToolCall implements Store.
func (s *PostgresStore) ToolCall(ctx context.Context, runID, callID string) (ToolCall, error) {
	calls, err := s.toolCalls(ctx, runID, callID)
	if err != nil {
		return ToolCall{}, err
	}
	if len(calls) == 0 {
		return ToolCall{}, fmt.Errorf("%w: run %q call %q", ErrCallNotFound, runID, callID)
	}
	return calls[0], nil
}

// Turns implements Store.
func (s *PostgresStore) Turns(ctx context.Context, runID string) ([]TurnRow, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT iteration, turn FROM model_turns WHERE run_id = $1 ORDER BY iteration`, runID)
	if err != nil {
		return nil, fmt.Errorf("model turns of %q: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TurnRow, error) {
		t := TurnRow{RunID: runID}
		var b []byte
		err := row.Scan(&t.Iteration, &b)
		t.Turn = b
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("model turns of %q: %w", runID, err)
	}
	if out == nil {
		out = []TurnRow{}
	}
	return out, nil
}

// Verdicts implements Store.
func (s *PostgresStore) Verdicts(ctx context.Context, runID string) ([]VerdictRow, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT iteration, allowed, code, reason FROM verdicts WHERE run_id = $1 ORDER BY iteration`, runID)
	if err != nil {
		return nil, fmt.Errorf("verdicts of %q: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (VerdictRow, error) {
		v := VerdictRow{RunID: runID}
		var code, reason *string
		err := row.Scan(&v.Iteration, &v.Allowed, &code, &reason)
		v.Code, v.Reason = deref(code), deref(reason)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("verdicts of %q: %w", runID, err)
	}
	if out == nil {
		out = []VerdictRow{}
	}
	return out, nil
}

// RunTools implements Store.
func (s *PostgresStore) RunTools(ctx context.Context, runID string) ([]ToolDefRow, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT name, version, definition FROM run_tools WHERE run_id = $1
		ORDER BY name, version`, runID)
	if err != nil {
		return nil, fmt.Errorf("tool definitions of %q: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ToolDefRow, error) {
		d := ToolDefRow{RunID: runID}
		var b []byte
		err := row.Scan(&d.Name, &d.Version, &b)
		d.Definition = b
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("tool definitions of %q: %w", runID, err)
	}
	if out == nil {
		out = []ToolDefRow{}
	}
	return out, nil
}

// CompletedRuns implements Store.
func (s *PostgresStore) CompletedRuns(ctx context.Context, orgID, agent string, before time.Time, limit int) ([]Run, error) {
	ctx, cancel := withTimeout(ctx, defaultReadTimeout)
	defer cancel()
	if limit < 1 {
		limit = 1
	}
	rows, err := s.pool.Query(ctx, `SELECT `+runColumns+`, r.outputs, r.pinned FROM runs r
		WHERE r.status = 'completed' AND r.org_id = $1 AND r.agent = $2 AND r.created_at < $3
		ORDER BY r.created_at DESC, r.run_id DESC LIMIT $4`, orgID, agent, before, limit)
	if err != nil {
		return nil, fmt.Errorf("completed runs of %s/%s: %w", orgID, agent, err)
	}
	defer rows.Close()
	out := []Run{}
	for rows.Next() {
		var outputs, pinned []byte
		run, err := scanRun(rows, &outputs, &pinned)
		if err != nil {
			return nil, fmt.Errorf("completed runs of %s/%s: %w", orgID, agent, err)
		}
		run.Outputs, run.Pinned = outputs, pinned
		out = append(out, run)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("completed runs of %s/%s: %w", orgID, agent, err)
	}
	return out, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nullJSON maps absent and JSON-null documents to SQL NULL.
func nullJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return b
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
func (s *PostgresStore) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
