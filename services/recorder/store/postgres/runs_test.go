package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
)

// upsertRunSQL applies one RunUpdate: the statement the store ran per update
// before it merged them (the SQLite store's sqliteUpsertRunSQL still does).
// It is the oracle of the merge: a batch's updates merged and applied at
// once must leave the row this leaves applying them one by one.
var upsertRunSQL = func() string {
	wins := "($16::boolean AND " + sqlstore.StatusWins("EXCLUDED.status", "EXCLUDED.status_at", "r.status", "r.status_at") + ")"
	takeTenant := "(EXCLUDED.org_id IS NOT NULL AND (EXCLUDED.request IS NOT NULL OR r.org_id IS NULL))"
	takeAgent := "(EXCLUDED.agent IS NOT NULL AND (EXCLUDED.request IS NOT NULL OR r.agent IS NULL))"
	return `
INSERT INTO runs AS r (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason,
	outputs, pinned, trace_id, iterations, tool_calls, created_at, updated_at, completed_at, spend, outputs_blob)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $7, $7, $15, $17, $18)
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
	outputs_blob = COALESCE(r.outputs_blob, EXCLUDED.outputs_blob),
	trace_id     = COALESCE(r.trace_id, EXCLUDED.trace_id),
	iterations   = GREATEST(r.iterations, EXCLUDED.iterations),
	tool_calls   = GREATEST(r.tool_calls, EXCLUDED.tool_calls),
	spend        = GREATEST(r.spend, EXCLUDED.spend),
	created_at   = LEAST(r.created_at, EXCLUDED.created_at),
	updated_at   = GREATEST(r.updated_at, EXCLUDED.updated_at)`
}()

// upsertRunArgs are upsertRunSQL's arguments for u.
func upsertRunArgs(u *store.RunUpdate) []any {
	status, hasStatus := u.Status, u.Status != ""
	if !hasStatus {
		status = store.StatusRequested
	}
	var done *time.Time
	if store.IsTerminal(status) {
		t := u.At
		done = &t
	}
	var ws, user *string
	if u.Tenant.OrgID != "" {
		ws, user = &u.Tenant.WorkspaceID, &u.Tenant.UserID
	}
	return []any{u.RunID, sqlstore.NullString(u.Tenant.OrgID), ws, user, sqlstore.NullString(u.Agent), status, u.At,
		sqlstore.NullJSON(u.Request), sqlstore.NullString(u.Reason), sqlstore.NullJSON(u.Outputs), sqlstore.NullJSON(u.Pinned),
		sqlstore.NullString(u.TraceID), u.Iterations, u.ToolCalls, done, hasStatus, u.Spend, sqlstore.NullJSON(u.OutputsBlob)}
}

// mergeCase is a run row (seed: nil for none) and the updates of one batch.
type mergeCase struct {
	name    string
	seed    []store.RunUpdate
	updates []store.RunUpdate
}

var (
	mergeBase     = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	mergeTenantA  = envelope.Tenant{OrgID: "org-a", WorkspaceID: "ws-a", UserID: "user-a"}
	mergeTenantB  = envelope.Tenant{OrgID: "org-b", WorkspaceID: "ws-b"}
	mergeRequest1 = json.RawMessage(`{"run_id":"r","n":1}`)
	mergeRequest2 = json.RawMessage(`{"run_id":"r","n":2}`)
)

func mergeAt(ms int) time.Time { return mergeBase.Add(time.Duration(ms) * time.Millisecond) }

func spendPtr(v float64) *float64 { return &v }

// mergeCases pin down each rule of upsertRunSQL; runMergeCases runs each of
// them on no row and on every seed of mergeSeeds too.
var mergeCases = []mergeCase{
	{name: "one update", updates: []store.RunUpdate{
		{At: mergeAt(1), Status: store.StatusRequested, Request: mergeRequest1, Tenant: mergeTenantA, Agent: "a"},
	}},
	{name: "statuses move forward only", updates: []store.RunUpdate{
		{At: mergeAt(3), Status: events.StatusCompleted, Reason: "done"},
		{At: mergeAt(4), Status: events.StatusStarted},
		{At: mergeAt(1), Status: store.StatusRequested},
	}},
	{name: "same rank: the later time wins", updates: []store.RunUpdate{
		{At: mergeAt(5), Status: events.StatusResumed, Reason: "resumed"},
		{At: mergeAt(4), Status: events.StatusSuspended, Reason: "suspended"},
		{At: mergeAt(6), Status: events.StatusSuspended, Reason: "suspended again"},
	}},
	{name: "same rank and time: the greater name wins", updates: []store.RunUpdate{
		{At: mergeAt(5), Status: events.StatusFailed, Reason: "failed"},
		{At: mergeAt(5), Status: events.StatusCompleted, Reason: "completed"},
	}},
	{name: "same rank and time, greater name last", updates: []store.RunUpdate{
		{At: mergeAt(5), Status: events.StatusCompleted, Reason: "completed"},
		{At: mergeAt(5), Status: events.StatusFailed, Reason: "failed"},
	}},
	{name: "equal statuses: the first keeps its reason", updates: []store.RunUpdate{
		{At: mergeAt(5), Status: events.StatusFailed, Reason: "first"},
		{At: mergeAt(5), Status: events.StatusFailed, Reason: "second"},
	}},
	{name: "times within a microsecond tie", updates: []store.RunUpdate{
		{At: mergeAt(5).Add(100 * time.Nanosecond), Status: events.StatusSuspended, Reason: "first"},
		{At: mergeAt(5).Add(900 * time.Nanosecond), Status: events.StatusResumed, Reason: "second"},
		{At: mergeAt(5).Add(300 * time.Nanosecond), Status: events.StatusSuspended, Reason: "third"},
	}},
	{name: "first without status, then an earlier request", updates: []store.RunUpdate{
		{At: mergeAt(5), Iterations: 1, Reason: "no status"},
		{At: mergeAt(3), Status: store.StatusRequested, Request: mergeRequest1, Tenant: mergeTenantA, Agent: "a"},
	}},
	{name: "first without status, then a later request", updates: []store.RunUpdate{
		{At: mergeAt(5), Iterations: 1},
		{At: mergeAt(7), Status: store.StatusRequested, Reason: "later"},
	}},
	{name: "no status at all", updates: []store.RunUpdate{
		{At: mergeAt(5), Iterations: 2, ToolCalls: 1},
		{At: mergeAt(2), Iterations: 1, ToolCalls: 3, Reason: "ignored"},
	}},
	{name: "terminal status sets completed_at, an earlier one moves it", updates: []store.RunUpdate{
		{At: mergeAt(8), Status: events.StatusCompleted},
		{At: mergeAt(9), Status: events.StatusFailed, Reason: "late failure"},
		{At: mergeAt(7), Status: events.StatusFailed},
	}},
	{name: "tenant: the first named, without a request", updates: []store.RunUpdate{
		{At: mergeAt(1)},
		{At: mergeAt(2), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(3), Tenant: mergeTenantA, Agent: "a"},
	}},
	{name: "tenant: a request overrides", updates: []store.RunUpdate{
		{At: mergeAt(2), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(1), Status: store.StatusRequested, Request: mergeRequest1, Tenant: mergeTenantA, Agent: "a"},
		{At: mergeAt(3), Tenant: mergeTenantB, Agent: "b"},
	}},
	{name: "tenant: the last of two requests wins", updates: []store.RunUpdate{
		{At: mergeAt(1), Status: store.StatusRequested, Request: mergeRequest1, Tenant: mergeTenantA, Agent: "a"},
		{At: mergeAt(2), Request: mergeRequest2, Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(3), Tenant: mergeTenantA, Agent: "c"},
	}},
	{name: "a request naming no tenant forces nothing", updates: []store.RunUpdate{
		{At: mergeAt(1), Request: mergeRequest1},
		{At: mergeAt(2), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(3), Tenant: mergeTenantA, Agent: "a"},
	}},
	{name: "a request naming only an agent", updates: []store.RunUpdate{
		{At: mergeAt(1), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(2), Request: mergeRequest1, Agent: "a"},
	}},
	{name: "a request naming only a tenant", updates: []store.RunUpdate{
		{At: mergeAt(1), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(2), Request: mergeRequest1, Tenant: mergeTenantA},
	}},
	{name: "JSON null says nothing", updates: []store.RunUpdate{
		{At: mergeAt(1), Request: json.RawMessage(`null`), Outputs: json.RawMessage(`null`), Tenant: mergeTenantB, Agent: "b"},
		{At: mergeAt(2), Tenant: mergeTenantA, Agent: "a", Outputs: json.RawMessage(`{"o":1}`), Pinned: json.RawMessage(`null`)},
		{At: mergeAt(3), Request: mergeRequest2, Pinned: json.RawMessage(`{"p":1}`)},
	}},
	{name: "documents and trace: the first", updates: []store.RunUpdate{
		{At: mergeAt(1), TraceID: ""},
		{At: mergeAt(2), TraceID: "trace-1", Outputs: json.RawMessage(`{"o":1}`)},
		{At: mergeAt(3), TraceID: "trace-2", Outputs: json.RawMessage(`{"o":2}`), Pinned: json.RawMessage(`{"p":2}`)},
	}},
	{name: "outputs blob: the first", updates: []store.RunUpdate{
		{At: mergeAt(1), OutputsBlob: json.RawMessage(`null`)},
		{At: mergeAt(2), Status: events.StatusCompleted, OutputsBlob: json.RawMessage(`{"kind":"blob","url":"/v1/blobs/r.outputs"}`)},
		{At: mergeAt(3), OutputsBlob: json.RawMessage(`{"kind":"blob","url":"/v1/blobs/other"}`)},
	}},
	{name: "counts and spend: the greatest", updates: []store.RunUpdate{
		{At: mergeAt(1), Iterations: 2, ToolCalls: 5, Spend: spendPtr(0.5)},
		{At: mergeAt(2), Iterations: 3, ToolCalls: 1},
		{At: mergeAt(3), Iterations: 1, ToolCalls: 7, Spend: spendPtr(0.25)},
		{At: mergeAt(4), Spend: spendPtr(0.75)},
	}},
	{name: "spend NaN is the greatest", updates: []store.RunUpdate{
		{At: mergeAt(1), Spend: spendPtr(2)},
		{At: mergeAt(2), Spend: spendPtr(math.NaN())},
		{At: mergeAt(3), Spend: spendPtr(3)},
	}},
	{name: "times out of order", updates: []store.RunUpdate{
		{At: mergeAt(5)},
		{At: mergeAt(9)},
		{At: mergeAt(1)},
		{At: mergeAt(7)},
	}},
}

// mergeSeeds are rows the cases run on besides no row.
var mergeSeeds = map[string][]store.RunUpdate{
	"requested": {{At: mergeAt(2), Status: store.StatusRequested, Request: mergeRequest1, Tenant: mergeTenantA, Agent: "a", TraceID: "seed"}},
	"started, no request": {{At: mergeAt(4), Status: events.StatusStarted, Tenant: mergeTenantB, Agent: "b", Iterations: 2,
		Spend: spendPtr(1)}},
	"suspended": {{At: mergeAt(5), Status: events.StatusSuspended, Reason: "waiting", Outputs: json.RawMessage(`{"seed":1}`)}},
	"completed": {{At: mergeAt(6), Status: events.StatusCompleted, Reason: "seed done", ToolCalls: 9}},
	"bare":      {{At: mergeAt(5)}},
}

func TestRunMergeMatchesOneByOne(t *testing.T) {
	pool := newTestPool(t)
	for i, c := range mergeCases {
		checkMerge(t, pool, fmt.Sprintf("c%d", i), c)
		for name, seed := range mergeSeeds {
			sc := c
			sc.name, sc.seed = c.name+" on "+name, seed
			checkMerge(t, pool, fmt.Sprintf("c%d-%s", i, strings.ReplaceAll(name, " ", "_")), sc)
		}
	}
}

// TestRunMergeMatchesOneByOneRandom checks random batches: statuses, times
// (some a fraction of a microsecond apart), tenants, agents, requests and
// documents from small sets, so that they collide often.
func TestRunMergeMatchesOneByOneRandom(t *testing.T) {
	pool := newTestPool(t)
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 300 {
		c := mergeCase{name: fmt.Sprintf("random %d", i)}
		for range rng.IntN(3) {
			c.seed = append(c.seed, randomUpdate(rng))
		}
		for range 1 + rng.IntN(8) {
			c.updates = append(c.updates, randomUpdate(rng))
		}
		checkMerge(t, pool, fmt.Sprintf("rand%d", i), c)
	}
}

func randomUpdate(rng *rand.Rand) store.RunUpdate {
	pick := func(n int) int { return rng.IntN(n) }
	statuses := append([]string{"", "", ""}, store.RunStatuses()...)
	tenants := []envelope.Tenant{{}, {}, mergeTenantA, mergeTenantB, {OrgID: "org-c"}}
	agents := []string{"", "", "a", "b"}
	docs := []json.RawMessage{nil, nil, json.RawMessage(`null`), json.RawMessage(`{"d":1}`), json.RawMessage(`{"d":2}`)}
	texts := []string{"", "", "x", "y"}
	u := store.RunUpdate{
		At:          mergeAt(pick(6)).Add(time.Duration(pick(3)*400) * time.Nanosecond),
		Status:      statuses[pick(len(statuses))],
		Tenant:      tenants[pick(len(tenants))],
		Agent:       agents[pick(len(agents))],
		Request:     docs[pick(len(docs))],
		Outputs:     docs[pick(len(docs))],
		Pinned:      docs[pick(len(docs))],
		OutputsBlob: docs[pick(len(docs))],
		Reason:      texts[pick(len(texts))],
		TraceID:     texts[pick(len(texts))],
	}
	u.Iterations, u.ToolCalls = pick(4), pick(4)
	if s := pick(4); s > 0 {
		u.Spend = spendPtr(float64(s) / 4)
	}
	return u
}

// checkMerge seeds two rows alike (upsertRunSQL, one by one), then applies
// c's updates to the first one by one and to the second as one batch, and
// compares the rows.
func checkMerge(t *testing.T, pool *pgxpool.Pool, id string, c mergeCase) {
	t.Helper()
	ctx := testContext(t)
	one, merged := "one-"+id, "merged-"+id
	for _, runID := range []string{one, merged} {
		for _, u := range withRun(c.seed, runID) {
			if _, err := pool.Exec(ctx, upsertRunSQL, upsertRunArgs(&u)...); err != nil {
				t.Fatalf("%s: seed: %v", c.name, err)
			}
		}
	}
	for _, u := range withRun(c.updates, one) {
		if _, err := pool.Exec(ctx, upsertRunSQL, upsertRunArgs(&u)...); err != nil {
			t.Fatalf("%s: one by one: %v", c.name, err)
		}
	}
	recs := make([]store.Record, len(c.updates))
	fresh := make([]bool, len(c.updates))
	for i, u := range withRun(c.updates, merged) {
		recs[i] = store.Record{Event: store.EventRow{ID: fmt.Sprintf("%s/%d", merged, i)}, Run: &u}
		fresh[i] = true
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := &effectQueue{recs: recs}
		if err := q.runs(fresh); err != nil {
			return err
		}
		if n := q.batch.Len(); n != 2 {
			return fmt.Errorf("%d statements for one run; want 2", n)
		}
		return q.send(ctx, tx)
	})
	if err != nil {
		t.Fatalf("%s: merged: %v", c.name, err)
	}
	var want, got string
	var same bool
	if err := pool.QueryRow(ctx, `SELECT a::text, b::text, a = b FROM
		(SELECT to_jsonb(r) - 'run_id' AS a FROM runs r WHERE run_id = $1) x,
		(SELECT to_jsonb(r) - 'run_id' AS b FROM runs r WHERE run_id = $2) y`, one, merged).Scan(&want, &got, &same); err != nil {
		t.Fatalf("%s: compare: %v", c.name, err)
	}
	if !same {
		t.Errorf("%s: merged row differs\n one by one: %s\n merged:     %s", c.name, want, got)
	}
}

func withRun(us []store.RunUpdate, runID string) []store.RunUpdate {
	out := make([]store.RunUpdate, len(us))
	for i, u := range us {
		u.RunID = runID
		out[i] = u
	}
	return out
}

// TestRunMergeRefusesAnUnknownStatus: the one-by-one upsert failed on a
// status outside runs_status_check, even on a row whose status it could not
// beat, so the merged write fails too.
func TestRunMergeRefusesAnUnknownStatus(t *testing.T) {
	pool := newTestPool(t)
	ctx := testContext(t)
	seed := store.RunUpdate{RunID: "run-bogus", At: mergeAt(1), Status: events.StatusCompleted}
	if _, err := pool.Exec(ctx, upsertRunSQL, upsertRunArgs(&seed)...); err != nil {
		t.Fatal(err)
	}
	bogus := store.RunUpdate{RunID: "run-bogus", At: mergeAt(2), Status: "bogus"}
	if _, err := pool.Exec(ctx, upsertRunSQL, upsertRunArgs(&bogus)...); err == nil {
		t.Fatal("the one-by-one upsert accepted status bogus; the merge's refusal is moot")
	}
	s := New(pool)
	ok := store.Record{Event: store.EventRow{ID: "ev-ok", Type: "t", Time: mergeAt(3)}, Run: &store.RunUpdate{RunID: "run-bogus", At: mergeAt(3)}}
	bad := store.Record{Event: store.EventRow{ID: "ev-bogus", Type: "t", Time: mergeAt(2)}, Run: &bogus}
	err := s.Write(ctx, ok, bad)
	if err == nil || !strings.Contains(err.Error(), `"ev-bogus"`) {
		t.Fatalf("Write = %v; want an error naming ev-bogus", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("the failed batch left %d events", n)
	}
}

func newTestPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := NewPool(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := Migrate(testContext(t), pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return pool
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
