package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// sqliteAdmit runs store.Admit on a batch's new records with what the
// database holds of their runs: whether each has a row, when it ended, which
// of the calls the records name its turns requested, and the records parked
// for the runs whose parked records the batch may let in. The write
// transaction is SQLite's only writer.
func sqliteAdmit(ctx context.Context, tx *sql.Tx, recs []store.Record) (store.Admission, error) {
	gates := make(map[string]*store.RunGate)
	runIDs, opening := store.GateRuns(recs)
	for _, id := range runIDs {
		var status, at string
		err := tx.QueryRowContext(ctx, `SELECT status, status_at FROM runs WHERE run_id = ?1`, id).Scan(&status, &at)
		if err == sql.ErrNoRows {
			continue
		}
		if err != nil {
			return store.Admission{}, fmt.Errorf("read run %q: %w", id, err)
		}
		g := &store.RunGate{Known: true, Calls: map[string]bool{}}
		if store.IsTerminal(status) {
			end, err := parseTime(at)
			if err != nil {
				return store.Admission{}, fmt.Errorf("run %q: %w", id, err)
			}
			g.End = &end
		}
		gates[id] = g
	}
	parked := make(map[string][]store.Parked)
	var parkedRecs []store.Record
	for _, id := range opening {
		rows, err := tx.QueryContext(ctx, `SELECT event_id, record FROM parked_events WHERE run_id = ?1 ORDER BY seq`, id)
		if err != nil {
			return store.Admission{}, fmt.Errorf("read parked events of run %q: %w", id, err)
		}
		for rows.Next() {
			var eventID, doc string
			if err := rows.Scan(&eventID, &doc); err != nil {
				_ = rows.Close()
				return store.Admission{}, fmt.Errorf("read parked events of run %q: %w", id, err)
			}
			r, err := store.DecodeParked([]byte(doc))
			if err != nil {
				_ = rows.Close()
				return store.Admission{}, fmt.Errorf("event %q: %w", eventID, err)
			}
			parked[id] = append(parked[id], store.Parked{Record: r, Stored: true})
			parkedRecs = append(parkedRecs, r)
		}
		if err := rows.Close(); err != nil {
			return store.Admission{}, err
		}
		if err := rows.Err(); err != nil {
			return store.Admission{}, fmt.Errorf("read parked events of run %q: %w", id, err)
		}
	}
	for _, k := range append(store.GateCalls(recs), store.GateCalls(parkedRecs)...) {
		g := gates[k.RunID]
		if g == nil || g.Calls[k.CallID] {
			continue
		}
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM tool_calls WHERE run_id = ?1 AND call_id = ?2`, k.RunID, k.CallID).Scan(&one)
		switch {
		case err == nil:
			g.Calls[k.CallID] = true
		case err != sql.ErrNoRows:
			return store.Admission{}, fmt.Errorf("read call %s of run %q: %w", k.CallID, k.RunID, err)
		}
	}
	return store.Admit(recs, gates, parked), nil
}

// sqlitePark keeps the admission's parked records: the released ones
// deleted, the new ones inserted in order.
func sqlitePark(ctx context.Context, tx *sql.Tx, a store.Admission) error {
	for _, k := range a.Released {
		if _, err := tx.ExecContext(ctx, `DELETE FROM parked_events WHERE run_id = ?1 AND event_id = ?2`, k.RunID, k.ID); err != nil {
			return fmt.Errorf("release parked event %q of run %q: %w", k.ID, k.RunID, err)
		}
	}
	ids, runs, docs, err := sqlstore.ToPark(a)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if _, err := tx.ExecContext(ctx, `INSERT INTO parked_events (event_id, run_id, record) VALUES (?1, ?2, ?3)
			ON CONFLICT (run_id, event_id) DO NOTHING`, id, runs[i], docs[i]); err != nil {
			return fmt.Errorf("park event %q: %w", id, err)
		}
	}
	return nil
}
