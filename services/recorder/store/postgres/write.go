package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// The write path of Store. A batch costs Postgres a handful of
// statements however many records it holds, where it used to cost a few per
// record: under load, the work per statement (and per upsert of the same run
// row, once per event) was most of Postgres's CPU. Every statement takes its
// rows as arrays (unnest) and applies them with the rules of Store.Write, so
// that the rows a batch leaves are exactly those that writing its records one
// by one, in order, would leave.

// writeRecords writes a batch in a few round trips. The first inserts every
// event row and learns which records are new; the next reads what the gate
// (store.Admit) needs of their runs, and the records parked for them; the
// last, pipelined, applies the admitted records' effects (their runs, tool
// calls, model turns, verdicts and tool definitions) and keeps the parked
// ones. The effects touch no events row, so applying them after all the
// inserts changes nothing, and the transaction still commits an event with
// all its effects (or its parking) or nothing.
func writeRecords(ctx context.Context, tx pgx.Tx, recs []store.Record) error {
	if err := lockRuns(ctx, tx, recs); err != nil {
		return err
	}
	fresh, err := insertEvents(ctx, tx, recs)
	if err != nil {
		return err
	}
	news := make([]store.Record, 0, len(recs))
	for i := range recs {
		if fresh[i] {
			news = append(news, recs[i])
		}
	}
	// The gate (store.Admit): what applies now, what waits for its run's
	// request or its call's turn, what never applies.
	adm, err := admit(ctx, tx, news)
	if err != nil {
		return err
	}
	q := &effectQueue{recs: adm.Apply}
	all := make([]bool, len(adm.Apply))
	for i := range all {
		all[i] = true
	}
	if err := q.runs(all); err != nil {
		return err
	}
	q.calls(all)
	q.others(all)
	if err := q.parked(adm); err != nil {
		return err
	}
	return q.send(ctx, tx)
}

// runLockClass is the first key of the advisory locks lockRuns takes, so
// that they never meet another user's single-key locks (goose's, say).
const runLockClass = 0x7477 // "tw"

// lockRuns takes, for the rest of the transaction, one advisory lock per run
// the batch records events of, in the order of their keys (so that two
// batches never wait on each other in a cycle). Two transactions writing
// events of the same run therefore commit in the order they drew the events'
// seqs, so a reader that pages a run's events by seq (the live stream, seq >
// after) never sees a higher seq before a lower one commits, and never skips
// one. This costs only writers of the same run; it replaced a filter on the
// oldest running transaction, which let any long transaction anywhere on
// the server hide every run's new events until it ended.
func lockRuns(ctx context.Context, tx pgx.Tx, recs []store.Record) error {
	keys := make([]int32, 0, 4)
	for i := range recs {
		if id := recs[i].Event.RunID; id != "" {
			keys = append(keys, runLockKey(id))
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if len(keys) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, k := range keys {
		b.Queue(`SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, int32(runLockClass), k)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock the runs of %d events: %w", len(recs), err)
	}
	return nil
}

// runLockKey is a run's advisory lock key: FNV-1a of its id, folded to 32
// bits. Two runs sharing a key only wait on each other.
func runLockKey(runID string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(runID)) // a hash.Hash never fails to write
	return int32(h.Sum32())
}

// batchError names the records whose rows a failed statement carried: the
// event itself when there is one (a batch that fails is written again record
// by record, which then names the culprit).
func batchError(recs []store.Record, owners []int, what string, err error) error {
	switch len(owners) {
	case 0:
		return fmt.Errorf("%s: %w", what, err)
	case 1:
		return fmt.Errorf("record event %q: %s: %w", recs[owners[0]].Event.ID, what, err)
	}
	return fmt.Errorf("record %d events: %s: %w", len(owners), what, err)
}

// insertEvents inserts every event row of the batch in one statement and
// reports which records are new ("fresh"): those whose event (its run and
// id) the statement inserted, on its first occurrence in the batch. Every row is
// sent, duplicates too, so that Postgres checks each as the one-by-one
// inserts did; inserted in batch order, the first occurrence of an id is the
// one stored and the later ones conflict with it (ON CONFLICT DO NOTHING
// skips a row that conflicts with one the same statement inserted).
func insertEvents(ctx context.Context, tx pgx.Tx, recs []store.Record) ([]bool, error) {
	var cols eventCols
	all := make([]int, len(recs))
	for i := range recs {
		all[i] = i
		err := textHoldsNoNUL(&recs[i])
		if err == nil {
			err = cols.add(&recs[i].Event)
		}
		if err != nil {
			return nil, fmt.Errorf("record event %q: %w", recs[i].Event.ID, err)
		}
	}
	rows, err := tx.Query(ctx, insertEventsSQL, cols.args()...)
	if err != nil {
		return nil, batchError(recs, all, "insert events", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.EventKey, error) {
		var k store.EventKey
		var run *string
		err := row.Scan(&run, &k.ID)
		if run != nil {
			k.RunID = *run
		}
		return k, err
	})
	if err != nil {
		return nil, batchError(recs, all, "insert events", err)
	}
	inserted := make(map[store.EventKey]bool, len(keys))
	for _, k := range keys {
		inserted[k] = true
	}
	fresh := make([]bool, len(recs))
	for i := range recs {
		k := recs[i].Event.Key()
		fresh[i] = inserted[k]
		inserted[k] = false // a later occurrence is a redelivery
	}
	return fresh, nil
}

const insertEventsSQL = `
INSERT INTO events (event_id, run_id, call_id, type, subject, source, time, stream, stream_seq, extensions, data)
SELECT event_id, run_id, call_id, type, subject, source, time, stream, stream_seq, extensions::json, data::json
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[],
	$8::text[], $9::bigint[], $10::text[], $11::text[]) WITH ORDINALITY
	AS e(event_id, run_id, call_id, type, subject, source, time, stream, stream_seq, extensions, data, ord)
ORDER BY ord
ON CONFLICT ((coalesce(run_id, '')), event_id) DO NOTHING
RETURNING run_id, event_id`

// eventCols are insertEventsSQL's arguments, a slice per column. json
// columns travel as text and are cast: the same check, and NULL elements.
type eventCols struct {
	id, typ, subject, source      []string
	run, call, stream, exts, data []*string
	at                            []time.Time
	streamSeq                     []*int64
}

// textHoldsNoNUL refuses a record whose run or call update has a NUL byte in
// a field kept as text: Postgres text cannot hold one, while the event's data
// can (json keeps it as \u0000). Postgres would refuse such a field only when
// it is sent, and the merges of a batch drop some fields (a losing status's
// reason, a later name); checking every record here, before any statement,
// refuses the same records however they are batched.
func textHoldsNoNUL(r *store.Record) error {
	type field struct{ name, value string }
	check := func(of string, fields []field) error {
		for _, f := range fields {
			if strings.IndexByte(f.value, 0) >= 0 {
				return fmt.Errorf("%w: the %s's %s holds a NUL byte, which a Postgres text column cannot", store.ErrUnstorable, of, f.name)
			}
		}
		return nil
	}
	if u := r.Run; u != nil {
		if err := check("run", []field{{"status", u.Status}, {"reason", u.Reason}, {"agent", u.Agent},
			{"trace id", u.TraceID}, {"org_id", u.Tenant.OrgID}, {"workspace_id", u.Tenant.WorkspaceID},
			{"user_id", u.Tenant.UserID}}); err != nil {
			return err
		}
	}
	for i := range r.Calls {
		u := &r.Calls[i]
		if err := check("call", []field{{"status", u.Status}, {"name", u.Name}, {"version", u.Version},
			{"queue", u.Queue}, {"error code", u.ErrorCode}}); err != nil {
			return err
		}
	}
	return nil
}

func (c *eventCols) add(e *store.EventRow) error {
	var exts *string
	if len(e.Extensions) > 0 {
		s, err := extensionsJSON(e.Extensions)
		if err != nil {
			return err
		}
		exts = &s
	}
	var seq *int64
	if e.StreamSeq > 0 {
		v := int64(e.StreamSeq)
		seq = &v
	}
	c.id, c.run, c.call = append(c.id, e.ID), append(c.run, sqlstore.NullString(e.RunID)), append(c.call, sqlstore.NullString(e.CallID))
	c.typ, c.subject, c.source = append(c.typ, e.Type), append(c.subject, e.Subject), append(c.source, e.Source)
	c.at, c.stream, c.streamSeq = append(c.at, e.Time), append(c.stream, sqlstore.NullString(e.Stream)), append(c.streamSeq, seq)
	c.exts, c.data = append(c.exts, exts), append(c.data, sqlstore.JSONText(e.Data))
	return nil
}

// extensionsJSON is json.Marshal(m) without its reflection: every event
// has a few extensions (run, call, tenant, trace), plain ASCII as a rule,
// which are written as they are; any other string is left to json.Marshal.
func extensionsJSON(m map[string]string) (string, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := writeJSONString(&b, k); err != nil {
			return "", err
		}
		b.WriteByte(':')
		if err := writeJSONString(&b, m[k]); err != nil {
			return "", err
		}
	}
	b.WriteByte('}')
	return b.String(), nil
}

// writeJSONString writes s as json.Marshal does: plain printable ASCII as it
// is, anything else through json.Marshal (escapes, HTML characters, UTF-8).
func writeJSONString(b *strings.Builder, s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, err := json.Marshal(s)
			if err != nil {
				return err
			}
			b.Write(q)
			return nil
		}
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
	return nil
}

func (c *eventCols) args() []any {
	return []any{c.id, c.run, c.call, c.typ, c.subject, c.source, c.at, c.stream, c.streamSeq, c.exts, c.data}
}

// effectQueue collects the effect statements of a batch into one pipelined
// pgx.Batch, with the records each statement carries (for its errors).
type effectQueue struct {
	recs   []store.Record
	batch  pgx.Batch
	what   []string
	owners [][]int
}

func (q *effectQueue) add(what string, owners []int, sql string, args ...any) {
	q.batch.Queue(sql, args...)
	q.what = append(q.what, what)
	q.owners = append(q.owners, owners)
}

// send runs the queued statements in one round trip, in order; the first
// error ends it.
func (q *effectQueue) send(ctx context.Context, tx pgx.Tx) error {
	if q.batch.Len() == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, &q.batch)
	for i := range q.batch.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return batchError(q.recs, q.owners[i], q.what[i], err)
		}
	}
	return br.Close()
}

// others queues the model turns, verdicts and tool definitions of the fresh
// records, a statement each. All three keep the first row of a key: inserted
// in batch order, a later row with the same key conflicts with the earlier
// one, as it did written after it. Every row is sent, so Postgres checks
// each (a turn without a document still fails).
func (q *effectQueue) others(fresh []bool) {
	var turns turnCols
	var verdicts verdictCols
	var tools toolCols
	var turnOwners, verdictOwners, toolOwners []int
	for i := range q.recs {
		if !fresh[i] {
			continue
		}
		r := &q.recs[i]
		if r.Turn != nil {
			turns.add(r.Turn)
			turnOwners = append(turnOwners, i)
		}
		if r.Verdict != nil {
			verdicts.add(r.Verdict)
			verdictOwners = append(verdictOwners, i)
		}
		for j := range r.Tools {
			tools.add(&r.Tools[j])
		}
		if len(r.Tools) > 0 {
			toolOwners = append(toolOwners, i)
		}
	}
	if len(turnOwners) > 0 {
		q.add("insert model turns", turnOwners, insertTurnsSQL, turns.args()...)
	}
	if len(verdictOwners) > 0 {
		q.add("insert verdicts", verdictOwners, insertVerdictsSQL, verdicts.args()...)
	}
	if len(toolOwners) > 0 {
		q.add("insert tool definitions", toolOwners, insertRunToolsSQL, tools.args()...)
	}
}

const (
	insertTurnsSQL = `INSERT INTO model_turns (run_id, iteration, turn)
SELECT run_id, iteration, turn::json
FROM unnest($1::text[], $2::integer[], $3::text[]) WITH ORDINALITY AS t(run_id, iteration, turn, ord)
ORDER BY ord
ON CONFLICT (run_id, iteration) DO NOTHING`
	insertVerdictsSQL = `INSERT INTO verdicts (run_id, iteration, allowed, code, reason)
SELECT run_id, iteration, allowed, code, reason
FROM unnest($1::text[], $2::integer[], $3::boolean[], $4::text[], $5::text[]) WITH ORDINALITY
	AS v(run_id, iteration, allowed, code, reason, ord)
ORDER BY ord
ON CONFLICT (run_id, iteration) DO NOTHING`
	insertRunToolsSQL = `INSERT INTO run_tools (run_id, name, version, definition)
SELECT run_id, name, version, definition::json
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY
	AS d(run_id, name, version, definition, ord)
ORDER BY ord
ON CONFLICT (run_id, name, version) DO NOTHING`
)

type turnCols struct {
	runID     []string
	iteration []int
	turn      []*string
}

func (c *turnCols) add(t *store.TurnRow) {
	c.runID, c.iteration, c.turn = append(c.runID, t.RunID), append(c.iteration, t.Iteration), append(c.turn, sqlstore.JSONText(t.Turn))
}

func (c *turnCols) args() []any { return []any{c.runID, c.iteration, c.turn} }

type verdictCols struct {
	runID        []string
	iteration    []int
	allowed      []bool
	code, reason []*string
}

func (c *verdictCols) add(v *store.VerdictRow) {
	c.runID, c.iteration, c.allowed = append(c.runID, v.RunID), append(c.iteration, v.Iteration), append(c.allowed, v.Allowed)
	c.code, c.reason = append(c.code, sqlstore.NullString(v.Code)), append(c.reason, sqlstore.NullString(v.Reason))
}

func (c *verdictCols) args() []any { return []any{c.runID, c.iteration, c.allowed, c.code, c.reason} }

type toolCols struct {
	runID, name, version []string
	definition           []*string
}

func (c *toolCols) add(d *store.ToolDefRow) {
	c.runID, c.name, c.version = append(c.runID, d.RunID), append(c.name, d.Name), append(c.version, d.Version)
	c.definition = append(c.definition, sqlstore.JSONText(d.Definition))
}

func (c *toolCols) args() []any { return []any{c.runID, c.name, c.version, c.definition} }

// calls queues the fresh records' tool call updates. A call's updates in
// one batch are merged into one where mergeCall shows that the merged update
// leaves any stored row as the updates one by one would: under load a call's
// request (its model turn), approval and completion often share a batch, and
// one row update instead of three saves Postgres two heap and index updates.
// The rest go in waves: ON CONFLICT DO UPDATE cannot touch a row twice in one
// statement, so wave k holds the k-th update of each call, in batch order,
// and the waves run in order. Each call still sees its updates in order, and
// updates of different calls touch different rows, so the rows are those of
// the one-by-one upserts. A model turn's record updates each of its calls
// once (RecordOf refuses a turn that names a call twice), so a record is in
// a wave at most once per call.
func (q *effectQueue) calls(fresh []bool) {
	type key struct{ run, call string }
	type update struct {
		rec int
		u   *store.CallUpdate
	}
	groups := make(map[key][]update)
	var order []key
	for i := range q.recs {
		if !fresh[i] {
			continue
		}
		for j := range q.recs[i].Calls {
			u := &q.recs[i].Calls[j]
			k := key{u.RunID, u.CallID}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], update{i, u})
		}
	}
	var (
		waves  [][]*store.CallUpdate
		wavesI [][]int
	)
	put := func(n int, u *store.CallUpdate, idx ...int) {
		for n >= len(waves) {
			waves, wavesI = append(waves, nil), append(wavesI, nil)
		}
		waves[n], wavesI[n] = append(waves[n], u), append(wavesI[n], idx...)
	}
	for _, k := range order {
		g := groups[k]
		us, idx := make([]*store.CallUpdate, len(g)), make([]int, len(g))
		for j, up := range g {
			us[j], idx[j] = up.u, up.rec
		}
		if m, ok := mergeCall(us); ok {
			put(0, m, idx...)
			continue
		}
		for n, u := range us {
			put(n, u, idx[n])
		}
	}
	for n, wave := range waves {
		var cols callCols
		for _, u := range wave {
			cols.add(u)
		}
		q.add("upsert tool calls", owners(wavesI[n]), upsertCallsSQL, cols.args()...)
	}
}

// owners is the records a statement carries, each once, in batch order
// (a turn's record carries several calls of one statement).
func owners(recs []int) []int {
	out := slices.Clone(recs)
	slices.Sort(out)
	return slices.Compact(out)
}

// mergeCall folds one call's updates, in order, into one update that the
// rules of sqlstore.CallUpsertSet apply to any stored row with the same result as the
// updates one by one; false when no such update is shown to exist. The
// status is the most advanced; seq, iteration, queue and the envelope are the
// first given; the envelope's own fields (its cost among them) come with the
// first envelope. Name,
// version, input and t_start are the first given when no update carries an
// envelope; with one, the envelope's values must be given and be the first
// given too (a row without an envelope takes the envelope's, one with an
// envelope keeps its own or takes the first given: both must agree).
func mergeCall(us []*store.CallUpdate) (*store.CallUpdate, bool) {
	if len(us) == 1 {
		return us[0], true
	}
	m := &store.CallUpdate{RunID: us[0].RunID, CallID: us[0].CallID, Status: us[0].Status}
	var env *store.CallUpdate
	for _, u := range us {
		if store.CallStatusRank(u.Status) > store.CallStatusRank(m.Status) {
			m.Status = u.Status
		}
		if m.Seq == nil {
			m.Seq = u.Seq
		}
		if m.Iteration == nil {
			m.Iteration = u.Iteration
		}
		if m.Queue == "" {
			m.Queue = u.Queue
		}
		if env == nil && sqlstore.NullJSON(u.Envelope) != nil {
			env = u
		}
		if m.Name == "" {
			m.Name = u.Name
		}
		if m.Version == "" {
			m.Version = u.Version
		}
		if sqlstore.NullJSON(m.Input) == nil {
			m.Input = u.Input
		}
		if m.TStart == nil {
			m.TStart = u.TStart
		}
	}
	if env == nil {
		return m, true
	}
	if env.Name == "" || env.Name != m.Name || env.Version == "" || env.Version != m.Version ||
		sqlstore.NullJSON(env.Input) == nil || !bytes.Equal(sqlstore.NullJSON(env.Input), sqlstore.NullJSON(m.Input)) ||
		env.TStart == nil || !env.TStart.Equal(*m.TStart) {
		return nil, false
	}
	m.Envelope, m.TEnd, m.LatencyMS, m.ErrorCode = env.Envelope, env.TEnd, env.LatencyMS, env.ErrorCode
	m.Cached, m.Truncated, m.Cost = env.Cached, env.Truncated, env.Cost
	m.TStart = env.TStart
	return m, true
}

// upsertCallsSQL applies CallUpdates, at most one per call, by the rules of
// sqlstore.CallUpsertSet.
var upsertCallsSQL = `
INSERT INTO tool_calls AS c (run_id, call_id, seq, iteration, name, version, status, error_code, input,
	envelope, t_start, t_end, latency_ms, cached, truncated, queue, cost)
SELECT run_id, call_id, seq, iteration, name, version, status, error_code, input::json,
	envelope::json, t_start, t_end, latency_ms, cached, truncated, queue, cost
FROM unnest($1::text[], $2::text[], $3::integer[], $4::integer[], $5::text[], $6::text[], $7::text[],
	$8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::timestamptz[], $13::bigint[],
	$14::boolean[], $15::boolean[], $16::text[], $17::double precision[]) WITH ORDINALITY
	AS u(run_id, call_id, seq, iteration, name, version, status, error_code, input,
	envelope, t_start, t_end, latency_ms, cached, truncated, queue, cost, ord)
ORDER BY ord
ON CONFLICT (run_id, call_id) DO UPDATE SET` + sqlstore.CallUpsertSet

type callCols struct {
	runID, callID, status                     []string
	seq, iteration                            []*int
	name, version, errorCode, input, envelope []*string
	queue                                     []*string
	tStart, tEnd                              []*time.Time
	latencyMS                                 []*int64
	cached, truncated                         []bool
	cost                                      []*float64
}

func (c *callCols) add(u *store.CallUpdate) {
	c.runID, c.callID, c.seq, c.iteration = append(c.runID, u.RunID), append(c.callID, u.CallID), append(c.seq, u.Seq), append(c.iteration, u.Iteration)
	c.name, c.version, c.status = append(c.name, sqlstore.NullString(u.Name)), append(c.version, sqlstore.NullString(u.Version)), append(c.status, u.Status)
	c.errorCode, c.input, c.envelope = append(c.errorCode, sqlstore.NullString(u.ErrorCode)), append(c.input, sqlstore.JSONText(u.Input)), append(c.envelope, sqlstore.JSONText(u.Envelope))
	c.tStart, c.tEnd, c.latencyMS = append(c.tStart, u.TStart), append(c.tEnd, u.TEnd), append(c.latencyMS, u.LatencyMS)
	c.cached, c.truncated = append(c.cached, u.Cached), append(c.truncated, u.Truncated)
	c.queue, c.cost = append(c.queue, sqlstore.NullString(u.Queue)), append(c.cost, u.Cost)
}

func (c *callCols) args() []any {
	return []any{c.runID, c.callID, c.seq, c.iteration, c.name, c.version, c.status, c.errorCode, c.input,
		c.envelope, c.tStart, c.tEnd, c.latencyMS, c.cached, c.truncated, c.queue, c.cost}
}
