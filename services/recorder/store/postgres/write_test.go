package postgres_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestPostgresBatchesEqualOneByOne writes the same records, redeliveries
// included, into stores: one record per Write, in batches of random sizes,
// and all in one batch. Every table must end up the same, events in the same
// recorded order.
func TestPostgresBatchesEqualOneByOne(t *testing.T) {
	var recs []store.Record
	done := storetest.CompletedRun(t, "run-done", "weather", storetest.TenantA, storetest.Base)
	recs = append(recs, done.Records(t)...)
	recs = append(recs, storetest.Records(t, storetest.SideEvents(t, done)...)...)
	recs = append(recs, storetest.FailedRun(t, "run-failed", "weather", storetest.TenantB, storetest.Base, "budget").Records(t)...)
	recs = append(recs, benchRunRecords(t, "run-wide", storetest.Base)...)
	recs = append(recs, benchRunRecords(t, "run-wide-2", storetest.Base)...)
	recs = append(recs, namingRecords()...)
	withTools(recs)
	rng := rand.New(rand.NewPCG(3, 5)) //nolint:gosec // G404: seeded, so that a failing order is reproducible
	for range len(recs) / 4 {          // redeliveries, some in the same batch as the first delivery
		recs = append(recs, recs[rng.IntN(len(recs))])
	}
	rng.Shuffle(len(recs), func(a, b int) { recs[a], recs[b] = recs[b], recs[a] })
	// Group the runs' records within stretches, like a batch writer under load.
	for i := 0; i < len(recs); i += 64 {
		chunk := recs[i:min(i+64, len(recs))]
		slices.SortStableFunc(chunk, func(x, y store.Record) int {
			return strings.Compare(x.Event.RunID, y.Event.RunID)
		})
	}

	_, want := writeAll(t, recs, func(int) int { return 1 })
	for name, size := range map[string]func(left int) int{
		"random batches": func(int) int { return 1 + rng.IntN(len(recs)/2) },
		"one batch":      func(left int) int { return left },
	} {
		t.Run(name, func(t *testing.T) {
			n, got := writeAll(t, recs, size)
			if n < 2 && name != "one batch" {
				t.Fatalf("%d batches", n)
			}
			for table := range dumpQueries {
				if want[table] != got[table] {
					t.Errorf("%s differ\n one by one: %s\n batched:    %s", table, want[table], got[table])
				}
				if len(want[table]) < 100 {
					t.Errorf("%s: dump %q is too small to compare anything", table, want[table])
				}
			}
		})
	}
}

// writeAll writes recs into a new store in batches of size(records left)
// and returns the number of batches and the store's tables.
func writeAll(t *testing.T, recs []store.Record, size func(left int) int) (int, map[string]string) {
	t.Helper()
	s, pool := newPostgres(t)
	batches := 0
	for rest := recs; len(rest) > 0; batches++ {
		n := min(size(len(rest)), len(rest))
		if err := s.Write(testCtx(t), rest[:n]...); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	tables := make(map[string]string, len(dumpQueries))
	for table, q := range dumpQueries {
		tables[table] = dump(t, pool, q)
	}
	return batches, tables
}

// namingRecords are updates of one call that name it differently before its
// envelope arrives: the first to name each field wins, so the order in which
// a batch applies them shows.
func namingRecords() []store.Record {
	rec := func(id, status, name, version string) store.Record {
		return store.Record{
			Event: store.EventRow{ID: id, Type: "test.naming", Source: storetest.Source, Subject: "test",
				Time: storetest.Base, RunID: "run-naming", CallID: "call-1"},
			Calls: []store.CallUpdate{{RunID: "run-naming", CallID: "call-1", Status: status, Name: name,
				Version: version, Input: json.RawMessage(`{"from":"` + id + `"}`)}},
		}
	}
	t0, t1 := storetest.Base, storetest.Base.Add(time.Second)
	lat, cost := int64(7), 0.25
	// withEnv makes a record a completion: it carries an envelope (and the
	// fields that come from it) and names the call as the envelope does.
	withEnv := func(r store.Record, tStart time.Time, code string) store.Record {
		c := r.Calls[0]
		c.Envelope = json.RawMessage(`{"call_id":"` + c.CallID + `","from":"` + r.Event.ID + `"}`)
		c.TStart, c.TEnd, c.LatencyMS, c.ErrorCode, c.Cached, c.Cost = &tStart, &t1, &lat, code, true, &cost
		r.Calls = []store.CallUpdate{c}
		return r
	}
	queued := func(r store.Record, queue string) store.Record {
		r.Calls[0].Queue = queue
		return r
	}
	on := func(r store.Record, call string, tStart *time.Time) store.Record {
		c := r.Calls[0]
		c.CallID, c.TStart = call, tStart
		if call == "call-4" || call == "call-5" {
			c.Input = json.RawMessage(`{"q":1}`)
		}
		r.Calls, r.Event.CallID = []store.CallUpdate{c}, call
		return r
	}
	return []store.Record{
		rec("naming-1", store.CallRequested, "", "1.0.0"),
		rec("naming-2", store.CallApproved, "second", ""),
		rec("naming-3", store.CallRequested, "third", "3.0.0"),
		rec("naming-4", store.CallStarted, "fourth", "4.0.0"),
		queued(rec("naming-5", store.CallApproved, "fifth", "5.0.0"), "first-queue"),
		queued(rec("naming-6", store.CallApproved, "sixth", "6.0.0"), "second-queue"),
		// call-2: its envelope names it otherwise than its request did.
		on(rec("env-2a", store.CallRequested, "asked", "1.0.0"), "call-2", nil),
		on(withEnv(rec("env-2b", store.CallCompleted, "answered", "2.0.0"), t0, "TIMEOUT"), "call-2", &t0),
		// call-3: the envelope comes first, the request after it.
		on(withEnv(rec("env-3a", store.CallCompleted, "same", "1.0.0"), t0, ""), "call-3", &t0),
		on(rec("env-3b", store.CallRequested, "other", "9.0.0"), "call-3", nil),
		// call-4: every update agrees, as the pipeline's do.
		on(rec("env-4a", store.CallRequested, "agreed", "1.0.0"), "call-4", nil),
		on(rec("env-4b", store.CallStarted, "agreed", "1.0.0"), "call-4", &t0),
		on(withEnv(rec("env-4c", store.CallCompleted, "agreed", "1.0.0"), t0, ""), "call-4", &t0),
		// call-5: started and the envelope disagree on the start time.
		on(rec("env-5a", store.CallStarted, "late", "1.0.0"), "call-5", &t1),
		on(withEnv(rec("env-5b", store.CallCompleted, "late", "1.0.0"), t0, ""), "call-5", &t0),
	}
}

// dumpQueries render each table as one JSON document, in key order, without
// what the store sets itself (seq, recorded_at, txid).
var dumpQueries = map[string]string{
	"events":      `SELECT jsonb_agg(to_jsonb(e) - 'seq' - 'recorded_at' - 'txid' ORDER BY seq)::text FROM events e`,
	"runs":        `SELECT jsonb_agg(to_jsonb(r) ORDER BY run_id)::text FROM runs r`,
	"tool_calls":  `SELECT jsonb_agg(to_jsonb(c) ORDER BY run_id, call_id)::text FROM tool_calls c`,
	"model_turns": `SELECT jsonb_agg(to_jsonb(m) ORDER BY run_id, iteration)::text FROM model_turns m`,
	"verdicts":    `SELECT jsonb_agg(to_jsonb(v) ORDER BY run_id, iteration)::text FROM verdicts v`,
	"run_tools":   `SELECT jsonb_agg(to_jsonb(d) ORDER BY run_id, name, version)::text FROM run_tools d`,
}

// withTools gives the model turns the tool definitions the recorder adds from
// its registry; two turns of a run offer the same tool version differently,
// so that which one is kept (the first) shows.
func withTools(recs []store.Record) {
	for i := range recs {
		if t := recs[i].Turn; t != nil {
			def := json.RawMessage(`{"name":"web_search","version":"1.2.0","offered_in":` + strconv.Itoa(t.Iteration) + `}`)
			recs[i].Tools = []store.ToolDefRow{
				{RunID: t.RunID, Name: "web_search", Version: "1.2.0", Definition: def},
				{RunID: t.RunID, Name: "fetch_page", Version: "2.0.0", Definition: json.RawMessage(`{"name":"fetch_page"}`)},
			}
		}
	}
}

func dump(t *testing.T, pool *pgxpool.Pool, q string) string {
	t.Helper()
	var s *string
	if err := pool.QueryRow(testCtx(t), q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// TestPostgresWriteNamesTheFailingEvent: a record Postgres refuses, written
// alone (as the batch writer retries a failed batch), fails as ErrUnstorable
// with its event named.
func TestPostgresWriteNamesTheFailingEvent(t *testing.T) {
	s, _ := newPostgres(t)
	fx := storetest.CompletedRun(t, "run-bad", "weather", storetest.TenantA, storetest.Base)
	recs := fx.Records(t)
	// The run is requested, so that the records below apply (a record of a
	// run with no request waits for it, parked).
	if err := s.Write(testCtx(t), recs[0]); err != nil {
		t.Fatal(err)
	}
	bad := recs[len(recs)-1]
	bad.Event.Data = []byte("{\"text\":\"not UTF-8: \xff\"}")
	err := s.Write(testCtx(t), bad)
	if !errors.Is(err, store.ErrUnstorable) || !strings.Contains(err.Error(), `"`+bad.Event.ID+`": insert events`) {
		t.Errorf("Write = %v; want ErrUnstorable naming %s", err, bad.Event.ID)
	}
	// An effect's refusal names its event too: a model turn that is no JSON.
	turn := recs[slices.IndexFunc(recs, func(r store.Record) bool { return r.Turn != nil })]
	turn.Turn.Turn = []byte("{\"text\":\"not UTF-8: \xff\"}")
	err = s.Write(testCtx(t), turn)
	if !errors.Is(err, store.ErrUnstorable) || !strings.Contains(err.Error(), `"`+turn.Event.ID+`": insert model turns`) {
		t.Errorf("Write = %v; want ErrUnstorable naming %s", err, turn.Event.ID)
	}
	// However many rows of a statement the record has.
	offered := recs[slices.IndexFunc(recs, func(r store.Record) bool { return r.Turn != nil && r.Turn.Iteration == 2 })]
	offered.Tools = []store.ToolDefRow{
		{RunID: fx.RunID, Name: "web_search", Version: "1.2.0", Definition: json.RawMessage(`{"ok":true}`)},
		{RunID: fx.RunID, Name: "fetch_page", Version: "2.0.0", Definition: json.RawMessage("{\"text\":\"not UTF-8: \xff\"}")},
	}
	err = s.Write(testCtx(t), offered)
	if !errors.Is(err, store.ErrUnstorable) || !strings.Contains(err.Error(), `"`+offered.Event.ID+`": insert tool definitions`) {
		t.Errorf("Write = %v; want ErrUnstorable naming %s", err, offered.Event.ID)
	}
}
