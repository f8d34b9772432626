package postgres

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// TestWriteStatementsDoNotGrowWithTheBatch: the effects of a batch cost a
// fixed number of statements however many runs and events it holds: two for
// the runs, one for the calls (each call's four updates, its turn's request
// among them, merged into one), one each for turns, verdicts and tool
// definitions.
func TestWriteStatementsDoNotGrowWithTheBatch(t *testing.T) {
	for _, runs := range []int{1, 3, 50} {
		recs := busyRuns(runs)
		fresh := make([]bool, len(recs))
		for i := range fresh {
			fresh[i] = true
		}
		q := &effectQueue{recs: recs}
		if err := q.runs(fresh); err != nil {
			t.Fatal(err)
		}
		q.calls(fresh)
		q.others(fresh)
		want := []string{"insert runs", "update runs", "upsert tool calls", "insert model turns", "insert verdicts",
			"insert tool definitions"}
		if fmt.Sprint(q.what) != fmt.Sprint(want) {
			t.Errorf("%d runs, %d records: statements %q; want %q", runs, len(recs), q.what, want)
		}
		if n := len(q.owners[0]); n != len(recs) {
			t.Errorf("%d runs: the run statements carry %d records; want %d", runs, n, len(recs))
		}
	}
}

// busyRuns are the records of n runs, each with a model turn (its verdict,
// and the four calls it requests) and the four calls going through their
// other statuses, every record updating its run.
func busyRuns(n int) []store.Record {
	var recs []store.Record
	add := func(r store.Record) {
		r.Event.ID = fmt.Sprintf("ev-%d", len(recs))
		recs = append(recs, r)
	}
	for i := range n {
		runID := fmt.Sprintf("run-%d", i)
		run := func() *store.RunUpdate { return &store.RunUpdate{RunID: runID, At: mergeBase} }
		turn := store.Record{Run: run(), Turn: &store.TurnRow{RunID: runID, Iteration: 1},
			Verdict: &store.VerdictRow{RunID: runID, Iteration: 1, Allowed: true},
			Tools:   []store.ToolDefRow{{RunID: runID, Name: "t", Version: "1"}}}
		for c := range 4 {
			turn.Calls = append(turn.Calls, store.CallUpdate{RunID: runID, CallID: fmt.Sprint(c), Status: store.CallRequested})
		}
		add(turn)
		for _, status := range []string{store.CallApproved, store.CallStarted, store.CallCompleted} {
			for c := range 4 {
				add(store.Record{Run: run(), Calls: []store.CallUpdate{{RunID: runID, CallID: fmt.Sprint(c), Status: status}}})
			}
		}
	}
	return recs
}

// TestCallsThatCannotMergeGoInWaves: a call whose envelope names it otherwise
// than its request did keeps one statement per update; the other calls of the
// batch still merge into the first. A model turn that requests several calls
// is carried once by each statement it has rows in.
func TestCallsThatCannotMergeGoInWaves(t *testing.T) {
	tStart := mergeBase
	call := func(id, name string) store.CallUpdate {
		return store.CallUpdate{RunID: "r", CallID: id, Status: store.CallRequested, Name: name, Version: "1"}
	}
	req := func(id, name string) store.Record {
		return store.Record{Calls: []store.CallUpdate{call(id, name)}}
	}
	turn := func(calls ...store.CallUpdate) store.Record { return store.Record{Calls: calls} }
	done := func(call, name string) store.Record {
		return store.Record{Calls: []store.CallUpdate{{RunID: "r", CallID: call, Status: store.CallCompleted, Name: name, Version: "1",
			Input: []byte(`{}`), TStart: &tStart, Envelope: []byte(`{"call_id":"` + call + `"}`)}}}
	}
	for _, c := range []struct {
		name   string
		recs   []store.Record
		waves  int
		owners int // records the statements carry, all waves together
	}{
		{"agreeing", []store.Record{req("a", "echo"), done("a", "echo"), req("b", "echo"), done("b", "echo")}, 1, 4},
		{"renamed by its envelope", []store.Record{req("a", "echo"), done("a", "shout"), req("b", "echo"), done("b", "echo")}, 2, 4},
		{"one turn, agreeing", []store.Record{turn(call("a", "echo"), call("b", "echo")), done("a", "echo"), done("b", "echo")}, 1, 3},
		// Wave 1: the turn (its a and b, b merged with b's envelope) and b's
		// envelope; wave 2: a's envelope.
		{"one turn, renamed", []store.Record{turn(call("a", "echo"), call("b", "echo")), done("a", "shout"), done("b", "echo")}, 2, 3},
	} {
		q := &effectQueue{recs: c.recs}
		fresh := make([]bool, len(c.recs))
		for i := range fresh {
			fresh[i] = true
		}
		q.calls(fresh)
		if len(q.what) != c.waves {
			t.Errorf("%s: statements %q; want %d upserts", c.name, q.what, c.waves)
		}
		owned := 0
		for _, o := range q.owners {
			owned += len(o)
			for i := 1; i < len(o); i++ {
				if o[i] <= o[i-1] {
					t.Errorf("%s: a statement's records %v are not each once, in batch order", c.name, o)
				}
			}
		}
		if owned != c.owners {
			t.Errorf("%s: the statements carry %d records; want %d", c.name, owned, c.owners)
		}
	}
}

// extensionsJSON writes what json.Marshal writes, whatever the strings hold.
func TestExtensionsJSONIsJSONMarshal(t *testing.T) {
	for _, m := range []map[string]string{
		{"runid": "run-1", "callid": "ab12", "tenantid": "acme/ws", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"a": ""},
		{"quote": `say "hi"`, "slash": `a\b`, "html": "<b>&</b>", "ctl": "a\tb\n\x00", "del": "\x7f"},
		{"unicode": "héllo ✓", "bad": "\xff\xfe", "sep": "\u2028"},
		{"ké": "v", "z": "1", "A": "2"},
	} {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := extensionsJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("extensionsJSON(%q) = %s; want %s", m, got, want)
		}
	}
}

func FuzzExtensionsJSON(f *testing.F) {
	f.Add("runid", "run-1", "traceparent", "00-4bf9-01")
	f.Add("k", "<\"\\\x00é\xff>", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m := map[string]string{k1: v1, k2: v2}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := extensionsJSON(m)
		if err != nil || got != string(want) {
			t.Fatalf("extensionsJSON(%q) = %s, %v; want %s", m, got, err, want)
		}
	})
}
