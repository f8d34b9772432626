package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

type streamed struct {
	sseID string
	id    string
	typ   string
	raw   map[string]json.RawMessage
}

// readStream reads a run's live stream to its end event.
func readStream(t *testing.T, ctx context.Context, url, header, value string) (evs []streamed, end string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if header != "" {
		req.Header.Set(header, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var id, event, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event != "" {
				return evs, event + " " + data
			}
			if data != "" {
				var raw map[string]json.RawMessage
				if err := json.Unmarshal([]byte(data), &raw); err != nil {
					t.Fatalf("data %s: %v", data, err)
				}
				var ceID, typ string
				_ = json.Unmarshal(raw["id"], &ceID)
				_ = json.Unmarshal(raw["type"], &typ)
				evs = append(evs, streamed{sseID: id, id: ceID, typ: typ, raw: raw})
			}
			id, event, data = "", "", ""
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		}
	}
	t.Fatalf("the stream ended without an end event (%v) after %d events: %+v", sc.Err(), len(evs), evs)
	return nil, ""
}

// TestStreamIsCausalWhateverTheRecordedOrder: a run's events recorded in an
// order that inverts cause and effect (the end first, a call's envelope
// and decisions before its turn and its approval request, a late decision
// before the one applied, the run resumed before it was suspended) stream
// in causal order: the request, the turn, the approval request, the run's
// suspension for it, the decisions in the order they were published, the
// operator's approval, the run's resumption, the envelope, the end last; each a CloudEvent
// whose extension names are CloudEvents names. A stream resumed after any
// of its messages (Last-Event-ID) sends exactly the rest; after=seq skips
// what was recorded up to seq.
func TestStreamIsCausalWhateverTheRecordedOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st := sqlitetest.Store(t)
	fx := storetest.ApprovalRun(t, "causal", storetest.TenantA, time.Now(), events.DecisionApprove, events.DecisionDeny)
	end, err := events.NewRunStatus(storetest.Source, events.RunStatus{RunID: "causal", Status: events.StatusCompleted}, "", fx.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var callID string
	for _, o := range fx.Events {
		if o.Event.Type() == events.TypeCallApprovalRequired {
			callID = events.Ext(&o.Event, events.ExtCallID)
		}
	}
	suspended, err := events.NewRunStatus(storetest.Source, events.RunStatus{RunID: "causal", Status: events.StatusSuspended,
		Reason: "waiting for approval"}, callID, fx.Trace)
	if err != nil {
		t.Fatal(err)
	}
	resumed, err := events.NewRunStatus(storetest.Source, events.RunStatus{RunID: "causal", Status: events.StatusResumed}, callID, fx.Trace)
	if err != nil {
		t.Fatal(err)
	}
	// Dated after every event of the fixture (the end last), so that the
	// store's gate applies them all whatever order they are written in.
	var last time.Time
	for _, o := range fx.Events {
		if o.Event.Time().After(last) {
			last = o.Event.Time()
		}
	}
	suspended.Event.SetTime(last.Add(100 * time.Millisecond))
	resumed.Event.SetTime(last.Add(200 * time.Millisecond))
	end.Event.SetTime(last.Add(time.Second))
	recs := storetest.Records(t, append(fx.Events, suspended, resumed, end)...)
	// Their place in their streams, as published.
	streamSeq := map[string]uint64{}
	for i := range recs {
		e := &recs[i].Event
		e.Stream = events.StreamRuns
		if e.CallID != "" {
			e.Stream = events.StreamCalls
		}
		streamSeq[e.Stream]++
		e.StreamSeq = streamSeq[e.Stream]
	}
	byType := func(typ string, nth int) store.Record {
		for _, r := range recs {
			if r.Event.Type == typ {
				if nth == 0 {
					return r
				}
				nth--
			}
		}
		t.Fatalf("no %s", typ)
		return store.Record{}
	}
	request, turn := byType(events.TypeRunRequested, 0), byType(events.TypeTurnCompleted, 0)
	asked, applied, late := byType(events.TypeCallApprovalRequired, 0), byType(events.TypeCallDecided, 0), byType(events.TypeCallDecided, 1)
	approved, completed, ended := byType(events.TypeCallApproved, 0), byType(events.TypeCallCompleted, 0), byType(events.TypeRunCompleted, 0)
	susp, res := byType(events.TypeRunSuspended, 0), byType(events.TypeRunResumed, 0)
	recorded := []store.Record{request, late, res, completed, ended, approved, applied, susp, asked, turn}
	if len(recorded) != len(recs) {
		t.Fatalf("the fixture has %d events, the test orders %d", len(recs), len(recorded))
	}
	for _, r := range recorded {
		if err := st.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	defer close(done)
	srv := httptest.NewServer(api.New(st, api.Options{Log: slog.New(slog.DiscardHandler), Poll: 20 * time.Millisecond, Done: done}))
	defer srv.Close()
	url := srv.URL + "/v1/runs/causal/events/stream"

	got, endEv := readStream(t, ctx, url, "", "")
	var order []string
	for _, e := range got {
		order = append(order, e.id)
		for k := range e.raw {
			if !regexpCE.MatchString(k) {
				t.Errorf("attribute %q of %s is not a CloudEvents name", k, e.id)
			}
		}
		if string(e.raw["specversion"]) != `"1.0"` || e.raw["source"] == nil || e.raw["time"] == nil ||
			string(e.raw["datacontenttype"]) != `"application/json"` || e.raw["runid"] == nil || e.raw["tenantid"] == nil {
			t.Errorf("%s lacks CloudEvents attributes: %v", e.id, e.raw)
		}
	}
	want := []string{request.Event.ID, turn.Event.ID, asked.Event.ID, susp.Event.ID, applied.Event.ID, late.Event.ID,
		approved.Event.ID, res.Event.ID, completed.Event.ID, ended.Event.ID}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("streamed\n  %s\nwant\n  %s", strings.Join(order, "\n  "), strings.Join(want, "\n  "))
	}
	if !strings.HasPrefix(endEv, "end ") {
		t.Fatalf("the stream ended with %q", endEv)
	}
	for k := range got {
		rest, _ := readStream(t, ctx, url, "Last-Event-ID", got[k].sseID)
		var ids []string
		for _, e := range rest {
			ids = append(ids, e.id)
		}
		if strings.Join(ids, " ") != strings.Join(want[k+1:], " ") {
			t.Errorf("resumed after %s (%s): %v, want %v", got[k].sseID, got[k].id, ids, want[k+1:])
		}
	}
	// after=seq: what was recorded up to the approval request is known.
	seqOf := map[string]string{}
	for _, e := range got {
		seqOf[e.id] = e.sseID
	}
	rest, _ := readStream(t, ctx, url+"?after="+seqOf[asked.Event.ID], "", "")
	if len(rest) != 1 || rest[0].id != turn.Event.ID {
		t.Errorf("after the approval request's seq: %v, want the turn only (recorded after it)", rest)
	}
	if _, err := strconv.Atoi(got[0].sseID); err != nil {
		t.Errorf("SSE id %q is not a seq", got[0].sseID)
	}
}

// regexpCE is a CloudEvents attribute name: lowercase ASCII letters and
// digits.
var regexpCE = regexp.MustCompile(`^[a-z0-9]+$`)
