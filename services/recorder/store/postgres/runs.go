package postgres

import (
	"fmt"
	"math"
	"time"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// A batch's run updates, applied per run. Every event carries a RunUpdate, so
// a batch holds many of the same run: rather than upserting its row once per
// update, the batch merges them, in Go, into one runMerge per run whose single
// application gives the row that applying them one by one would. Two
// statements apply the merges of all the batch's runs:
//
//   - insertRunsSQL inserts, for each run, the row its first update would
//     have inserted, unless the run has a row (ON CONFLICT DO NOTHING);
//   - updateRunsSQL then applies each run's merge to its row, new or not.
//
// On a row that existed, that is the merge of u1..un applied once. On a row
// the first statement inserted from u1, applying u1 again changes nothing
// (its status does not beat itself, its tenant and agent are the row's, and
// COALESCE, GREATEST and LEAST are idempotent), so applying u1..un to it is
// applying u2..un: again what the one-by-one upserts give. Inserting first
// keeps concurrent recorders safe as the upsert was: the insert waits for a
// concurrent insert of the same run and skips once it commits, and the update,
// a later statement, sees that row.
//
// What the rows of a run become under its updates, field by field (the
// rules of Store.Write), and how the merge reproduces it:
//
//   - status, status_at, reason, completed_at: an update's status replaces
//     the row's when it beats it (statusBeats: rank, then time, the later
//     but the earlier of two ends, then name), so after u1..un the
//     row holds the greatest of the row's and the updates' statuses, the
//     earliest on ties. The merge keeps the first greatest of the updates',
//     which beats the row's exactly when one of them did;
//   - request, outputs, pinned, outputs_blob, trace_id: the row's, else the
//     first update's that has one: the merge keeps the first;
//   - org_id, workspace_id, user_id (together) and agent: an update that
//     carries a request and names them sets them; one without a request
//     sets them only on a row that has none. So the last update that
//     carries a request and names them wins, whatever the row held; without
//     one, the row's value stays, or the first update's that names one fills
//     it. The merge keeps that value and whether a request came with it
//     ("forced");
//   - iterations, tool_calls, spend, updated_at: the greatest; created_at:
//     the least. Times compare as Postgres stores them, to the microsecond.
//
// The values the merge drops (a later request, a losing status's reason) are
// not sent, so Postgres no longer checks them. For the records RecordOf makes
// they are parts of their event's data, which the events insert checks (its
// encoding); the checks that could fail on them alone are made in Go for
// every record: runs_status_check in mergeRuns, and a NUL byte, which the
// data holds as \u0000 but a text column cannot, in textHoldsNoNUL.

// runMerge is the merge of one run's updates in a batch.
type runMerge struct {
	first *store.RunUpdate // the row it would insert
	// status is the winning status update; nil when no update has one.
	status *store.RunUpdate
	// tenant and agent are the values the updates set (nil, "": none);
	// forced when a run request came with them.
	tenant                    *store.RunUpdate
	agent                     string
	tenantForced, agentForced bool
	request, outputs, pinned  []byte
	outputsBlob               []byte
	traceID                   string
	iterations, toolCalls     int
	spend                     *float64
	earliest, latest          time.Time
}

func newRunMerge(u *store.RunUpdate) *runMerge {
	m := &runMerge{first: u, earliest: pgTime(u.At), latest: pgTime(u.At)}
	m.add(u)
	return m
}

// add folds in the next update of the run, in batch order.
func (m *runMerge) add(u *store.RunUpdate) {
	if u.Status != "" && (m.status == nil || statusBeats(u, m.status)) {
		m.status = u
	}
	m.addTenant(u)
	m.request = firstJSON(m.request, u.Request)
	m.outputs = firstJSON(m.outputs, u.Outputs)
	m.pinned = firstJSON(m.pinned, u.Pinned)
	m.outputsBlob = firstJSON(m.outputsBlob, u.OutputsBlob)
	if m.traceID == "" {
		m.traceID = u.TraceID
	}
	m.iterations, m.toolCalls = max(m.iterations, u.Iterations), max(m.toolCalls, u.ToolCalls)
	if u.Spend != nil && (m.spend == nil || float8Greater(*u.Spend, *m.spend)) {
		m.spend = u.Spend
	}
	if at := pgTime(u.At); at.Before(m.earliest) {
		m.earliest = at
	} else if at.After(m.latest) {
		m.latest = at
	}
}

// addTenant keeps the tenant and agent the updates set: the last named with
// a request, else the first named.
func (m *runMerge) addTenant(u *store.RunUpdate) {
	withRequest := sqlstore.NullJSON(u.Request) != nil
	if u.Tenant.OrgID != "" && (withRequest || m.tenant == nil) {
		m.tenant, m.tenantForced = u, m.tenantForced || withRequest
	}
	if u.Agent != "" && (withRequest || m.agent == "") {
		m.agent, m.agentForced = u.Agent, m.agentForced || withRequest
	}
}

// statusBeats reports whether u's status wins over w's, as updateRunsSQL's
// comparison (sqlstore.StatusWins) decides: by rank, then time as Postgres
// stores it (the later, but the earlier of two ends), then name (the names
// of a rank, lowercase ASCII, sort alike in every collation).
func statusBeats(u, w *store.RunUpdate) bool {
	ru, rw := store.RunStatusRank(u.Status), store.RunStatusRank(w.Status)
	if ru != rw {
		return ru > rw
	}
	if tu, tw := pgTime(u.At), pgTime(w.At); !tu.Equal(tw) {
		return tu.After(tw) != store.IsTerminal(u.Status)
	}
	return u.Status > w.Status
}

// pgTime is t as a timestamptz holds it: pgx sends microseconds, rounded
// down, so that times closer than a microsecond compare equal in Postgres.
func pgTime(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// float8Greater is a > b as Postgres orders float8: NaN above every number.
func float8Greater(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return !math.IsNaN(b)
	}
	return a > b
}

func firstJSON(have, next []byte) []byte {
	if have != nil {
		return have
	}
	return sqlstore.NullJSON(next)
}

// mergeRuns merges the run updates of the fresh records, per run in the order
// the runs first appear. It refuses a status runs_status_check forbids: the
// one-by-one upsert failed on it (Postgres checks the row an upsert proposes
// even when it conflicts), so the batch must fail too.
func mergeRuns(recs []store.Record, fresh []bool) (merges []*runMerge, owners []int, err error) {
	byRun := make(map[string]*runMerge)
	for i := range recs {
		u := recs[i].Run
		if !fresh[i] || u == nil {
			continue
		}
		if u.Status != "" && store.RunStatusRank(u.Status) < 0 {
			return nil, nil, fmt.Errorf("record event %q: upsert run: status %q is not a run status", recs[i].Event.ID, u.Status)
		}
		owners = append(owners, i)
		if m, ok := byRun[u.RunID]; ok {
			m.add(u)
			continue
		}
		m := newRunMerge(u)
		byRun[u.RunID] = m
		merges = append(merges, m)
	}
	return merges, owners, nil
}

// runs queues the statements that apply the fresh records' run updates.
func (q *effectQueue) runs(fresh []bool) error {
	merges, owners, err := mergeRuns(q.recs, fresh)
	if err != nil || len(merges) == 0 {
		return err
	}
	var ins runInsertCols
	var upd runUpdateCols
	for _, m := range merges {
		ins.add(m.first)
		upd.add(m)
	}
	q.add("insert runs", owners, insertRunsSQL, ins.args()...)
	q.add("update runs", owners, updateRunsSQL, upd.args()...)
	return nil
}

// insertRunsSQL inserts the row of each run's first update, as the upsert of
// that update alone would: its status ('requested' when it has none) and time.
const insertRunsSQL = `
INSERT INTO runs (run_id, org_id, workspace_id, user_id, agent, status, status_at, request, reason,
	outputs, pinned, trace_id, iterations, tool_calls, created_at, updated_at, completed_at, spend, outputs_blob)
SELECT run_id, org_id, workspace_id, user_id, agent, status, at, request::json, reason,
	outputs::json, pinned::json, trace_id, iterations, tool_calls, at, at, completed_at, spend, outputs_blob::json
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[],
	$8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::integer[], $14::integer[],
	$15::timestamptz[], $16::double precision[], $17::text[]) WITH ORDINALITY
	AS u(run_id, org_id, workspace_id, user_id, agent, status, at, request, reason,
	outputs, pinned, trace_id, iterations, tool_calls, completed_at, spend, outputs_blob, ord)
ORDER BY ord
ON CONFLICT (run_id) DO NOTHING`

type runInsertCols struct {
	runID, status                                                 []string
	org, ws, user, agent, request, reason, outputs, pinned, trace []*string
	outputsBlob                                                   []*string
	at                                                            []time.Time
	completedAt                                                   []*time.Time
	iterations, toolCalls                                         []int
	spend                                                         []*float64
}

func (c *runInsertCols) add(u *store.RunUpdate) {
	status := u.Status
	if status == "" {
		status = store.StatusRequested // only for a new row: the least status
	}
	org, ws, user := tenantArgs(u)
	c.runID, c.org, c.ws, c.user = append(c.runID, u.RunID), append(c.org, org), append(c.ws, ws), append(c.user, user)
	c.agent, c.status, c.at = append(c.agent, sqlstore.NullString(u.Agent)), append(c.status, status), append(c.at, u.At)
	c.request, c.reason = append(c.request, sqlstore.JSONText(u.Request)), append(c.reason, sqlstore.NullString(u.Reason))
	c.outputs, c.pinned = append(c.outputs, sqlstore.JSONText(u.Outputs)), append(c.pinned, sqlstore.JSONText(u.Pinned))
	c.trace, c.iterations, c.toolCalls = append(c.trace, sqlstore.NullString(u.TraceID)), append(c.iterations, u.Iterations), append(c.toolCalls, u.ToolCalls)
	c.completedAt, c.spend = append(c.completedAt, completedAt(status, u.At)), append(c.spend, u.Spend)
	c.outputsBlob = append(c.outputsBlob, sqlstore.JSONText(u.OutputsBlob))
}

func (c *runInsertCols) args() []any {
	return []any{c.runID, c.org, c.ws, c.user, c.agent, c.status, c.at, c.request, c.reason,
		c.outputs, c.pinned, c.trace, c.iterations, c.toolCalls, c.completedAt, c.spend, c.outputsBlob}
}

// tenantArgs are a tenant's columns: all NULL unless it names an org.
func tenantArgs(u *store.RunUpdate) (org, ws, user *string) {
	if u == nil || u.Tenant.OrgID == "" {
		return nil, nil, nil
	}
	t := u.Tenant
	return &t.OrgID, &t.WorkspaceID, &t.UserID
}

// completedAt is a row's completed_at under status set at at.
func completedAt(status string, at time.Time) *time.Time {
	if !store.IsTerminal(status) {
		return nil
	}
	return &at
}

// updateRunsSQL applies each run's merge to its row: upsertRunSQL's rules
// with the merge's values, and the flags saying whether a status and a
// request came with them.
var updateRunsSQL = func() string {
	wins := "(u.has_status AND " + sqlstore.StatusWins("u.status", "u.status_at", "r.status", "r.status_at") + ")"
	takeTenant := "(u.org_id IS NOT NULL AND (u.tenant_forced OR r.org_id IS NULL))"
	takeAgent := "(u.agent IS NOT NULL AND (u.agent_forced OR r.agent IS NULL))"
	return `
UPDATE runs AS r SET
` + sqlstore.RunTakeSet("u", takeTenant, takeAgent, wins) + `	request      = COALESCE(r.request, u.request::json),
	outputs      = COALESCE(r.outputs, u.outputs::json),
	pinned       = COALESCE(r.pinned, u.pinned::json),
	outputs_blob = COALESCE(r.outputs_blob, u.outputs_blob::json),
	trace_id     = COALESCE(r.trace_id, u.trace_id),
	iterations   = GREATEST(r.iterations, u.iterations),
	tool_calls   = GREATEST(r.tool_calls, u.tool_calls),
	spend        = GREATEST(r.spend, u.spend),
	created_at   = LEAST(r.created_at, u.created_at),
	updated_at   = GREATEST(r.updated_at, u.updated_at)
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::boolean[], $6::text[], $7::boolean[],
	$8::boolean[], $9::text[], $10::timestamptz[], $11::text[], $12::timestamptz[], $13::text[], $14::text[],
	$15::text[], $16::text[], $17::integer[], $18::integer[], $19::double precision[], $20::timestamptz[],
	$21::timestamptz[], $22::text[])
	AS u(run_id, org_id, workspace_id, user_id, tenant_forced, agent, agent_forced,
	has_status, status, status_at, reason, completed_at, request, outputs,
	pinned, trace_id, iterations, tool_calls, spend, created_at,
	updated_at, outputs_blob)
WHERE r.run_id = u.run_id`
}()

type runUpdateCols struct {
	runID, status                                                 []string
	org, ws, user, agent, reason, request, outputs, pinned, trace []*string
	outputsBlob                                                   []*string
	tenantForced, agentForced, hasStatus                          []bool
	statusAt, created, updated                                    []time.Time
	completedAt                                                   []*time.Time
	iterations, toolCalls                                         []int
	spend                                                         []*float64
}

func (c *runUpdateCols) add(m *runMerge) {
	org, ws, user := tenantArgs(m.tenant)
	c.runID, c.org, c.ws, c.user = append(c.runID, m.first.RunID), append(c.org, org), append(c.ws, ws), append(c.user, user)
	c.tenantForced, c.agent, c.agentForced = append(c.tenantForced, m.tenantForced), append(c.agent, sqlstore.NullString(m.agent)), append(c.agentForced, m.agentForced)
	// Without a status the status columns are ignored; they only need to be
	// valid.
	w := m.status
	if w == nil {
		w = &store.RunUpdate{Status: store.StatusRequested, At: m.first.At}
	}
	c.hasStatus, c.status, c.statusAt = append(c.hasStatus, m.status != nil), append(c.status, w.Status), append(c.statusAt, w.At)
	c.reason, c.completedAt = append(c.reason, sqlstore.NullString(w.Reason)), append(c.completedAt, completedAt(w.Status, w.At))
	c.request, c.outputs, c.pinned = append(c.request, sqlstore.JSONText(m.request)), append(c.outputs, sqlstore.JSONText(m.outputs)), append(c.pinned, sqlstore.JSONText(m.pinned))
	c.trace, c.iterations, c.toolCalls = append(c.trace, sqlstore.NullString(m.traceID)), append(c.iterations, m.iterations), append(c.toolCalls, m.toolCalls)
	c.spend, c.created, c.updated = append(c.spend, m.spend), append(c.created, m.earliest), append(c.updated, m.latest)
	c.outputsBlob = append(c.outputsBlob, sqlstore.JSONText(m.outputsBlob))
}

func (c *runUpdateCols) args() []any {
	return []any{c.runID, c.org, c.ws, c.user, c.tenantForced, c.agent, c.agentForced,
		c.hasStatus, c.status, c.statusAt, c.reason, c.completedAt, c.request, c.outputs,
		c.pinned, c.trace, c.iterations, c.toolCalls, c.spend, c.created,
		c.updated, c.outputsBlob}
}
