package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// admit runs store.Admit on a batch's new records with what the database
// holds of their runs: whether each has a row, when it ended, which of the
// calls the batch names its turns requested, and the records parked for the
// runs whose parked records the batch may let in. It runs under the runs'
// advisory locks (lockRuns), so that no other writer changes them meanwhile.
func admit(ctx context.Context, tx pgx.Tx, recs []store.Record) (store.Admission, error) {
	gates := make(map[string]*store.RunGate)
	runIDs, opening := store.GateRuns(recs)
	if len(runIDs) == 0 {
		return store.Admit(recs, gates, nil), nil
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT run_id, status, status_at FROM runs WHERE run_id = ANY($1)`, runIDs)
	calls := store.GateCalls(recs)
	b.Queue(gateCallsSQL, callArgs(calls)...)
	b.Queue(`SELECT event_id, record FROM parked_events WHERE run_id = ANY($1) ORDER BY seq`, opening)
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	rows, err := br.Query()
	if err != nil {
		return store.Admission{}, fmt.Errorf("read the runs of the batch: %w", err)
	}
	var (
		runID, status string
		at            time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&runID, &status, &at}, func() error {
		g := &store.RunGate{Known: true, Calls: map[string]bool{}}
		if store.IsTerminal(status) {
			end := at
			g.End = &end
		}
		gates[runID] = g
		return nil
	}); err != nil {
		return store.Admission{}, fmt.Errorf("read the runs of the batch: %w", err)
	}
	if err := readCalls(br, gates); err != nil {
		return store.Admission{}, err
	}
	rows, err = br.Query()
	if err != nil {
		return store.Admission{}, fmt.Errorf("read parked events: %w", err)
	}
	parked := make(map[string][]store.Parked)
	var parkedRecs []store.Record
	var eventID, doc string
	if _, err := pgx.ForEachRow(rows, []any{&eventID, &doc}, func() error {
		r, err := store.DecodeParked([]byte(doc))
		if err != nil {
			return fmt.Errorf("event %q: %w", eventID, err)
		}
		parked[r.Event.RunID] = append(parked[r.Event.RunID], store.Parked{Record: r, Stored: true})
		parkedRecs = append(parkedRecs, r)
		return nil
	}); err != nil {
		return store.Admission{}, fmt.Errorf("read parked events: %w", err)
	}
	if err := br.Close(); err != nil {
		return store.Admission{}, fmt.Errorf("read the runs of the batch: %w", err)
	}
	// The parked records' calls, when they are not the batch's.
	if more := store.GateCalls(parkedRecs); len(more) > 0 {
		b := &pgx.Batch{}
		b.Queue(gateCallsSQL, callArgs(more)...)
		br := tx.SendBatch(ctx, b)
		err := readCalls(br, gates)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return store.Admission{}, err
		}
	}
	return store.Admit(recs, gates, parked), nil
}

// gateCallsSQL reads which of the given calls have a row: a call has one
// only once a turn of its run requested it.
const gateCallsSQL = `SELECT c.run_id, c.call_id FROM tool_calls c
JOIN unnest($1::text[], $2::text[]) AS k(run_id, call_id) ON c.run_id = k.run_id AND c.call_id = k.call_id`

func callArgs(keys []store.CallKey) []any {
	runs, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		runs[i], ids[i] = k.RunID, k.CallID
	}
	return []any{runs, ids}
}

func readCalls(br pgx.BatchResults, gates map[string]*store.RunGate) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("read the calls of the batch: %w", err)
	}
	var runID, callID string
	if _, err := pgx.ForEachRow(rows, []any{&runID, &callID}, func() error {
		if g := gates[runID]; g != nil {
			g.Calls[callID] = true
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the calls of the batch: %w", err)
	}
	return nil
}

// parked queues the statements that keep the admission's parked records:
// the released ones deleted, the new ones inserted in order.
func (q *effectQueue) parked(a store.Admission) error {
	if len(a.Released) > 0 {
		runs, ids := make([]string, len(a.Released)), make([]string, len(a.Released))
		for i, k := range a.Released {
			runs[i], ids[i] = k.RunID, k.ID
		}
		q.add("release parked events", nil, `DELETE FROM parked_events p USING unnest($1::text[], $2::text[]) AS k(run_id, event_id)
WHERE p.run_id = k.run_id AND p.event_id = k.event_id`, runs, ids)
	}
	ids, runs, docs, err := sqlstore.ToPark(a)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		what := "park events"
		if len(ids) == 1 {
			what = fmt.Sprintf("park event %q", ids[0])
		}
		q.add(what, nil, `INSERT INTO parked_events (event_id, run_id, record)
SELECT event_id, run_id, record FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS p(event_id, run_id, record, ord)
ORDER BY ord
ON CONFLICT (run_id, event_id) DO NOTHING`, ids, runs, docs)
	}
	return nil
}
