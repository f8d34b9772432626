package recorder_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

func toolDef(name, version, category string, side envelope.SideEffects, schema string) envelope.ToolDefinition {
	return envelope.ToolDefinition{Name: name, Version: version, Description: name + " for tests",
		InputSchema:    json.RawMessage(schema),
		Metadata:       envelope.ToolMetadata{Category: envelope.Category(category), SideEffects: side, Cache: envelope.CacheNone},
		Implementation: envelope.Implementation{Kind: envelope.ImplBuiltin}}
}

func (h *harness) register(defs ...registry.Entry) {
	h.t.Helper()
	reg, err := registry.Open(testCtx(h.t), h.env.JS)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range defs {
		if err := reg.Put(testCtx(h.t), e); err != nil {
			h.t.Fatal(err)
		}
	}
}

// fetch gets path from the API, which must answer 200, and decodes its body.
func fetch[T any](h *harness, path string) T {
	h.t.Helper()
	status, body := h.get(path)
	if status != http.StatusOK {
		h.t.Fatalf("GET %s: %d %s", path, status, body)
	}
	return decode[T](h.t, body)
}

func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("decode %T: %v\n%s", v, err, body)
	}
	return v
}

// TestRecorderReplayBundle: the bundle holds the request, the tool definitions
// as the model was offered them (the registry revision current at the turn,
// not a later one), every turn, every envelope, the outputs, how the run ended
// and the verdicts.
func TestRecorderReplayBundle(t *testing.T) {
	h := newHarness(t)
	base := time.Now().UTC().Truncate(time.Millisecond)
	asCalled := toolDef("web_search", "1.2.0", "search", envelope.SideEffectsReads, `{"type":"object","properties":{"query":{"type":"string"}}}`)
	later := toolDef("web_search", "1.2.0", "search", envelope.SideEffectsReads, `{"type":"object","properties":{"q":{"type":"string"}}}`)
	fetch := toolDef("fetch_page", "2.0.0", "api", envelope.SideEffectsReads, `{"type":"object"}`)
	h.register(
		registry.Entry{Definition: asCalled, UpdatedAt: base.Add(-time.Hour)},
		registry.Entry{Definition: fetch, UpdatedAt: base.Add(-time.Hour)},
		registry.Entry{Definition: later, UpdatedAt: base.Add(time.Hour)}, // changed after the run
	)
	// The recorder's catalog sees the later revision before the turn arrives.
	h.restart()

	fx := storetest.CompletedRun(t, "replay-bundle", "weather", storetest.TenantA, base)
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitIdle()

	status, body := h.get("/v1/runs/" + fx.RunID + "/replay")
	if status != http.StatusOK {
		t.Fatalf("replay: %d %s", status, body)
	}
	b := decode[envelope.ReplayBundle](t, body)
	if b.RunID != fx.RunID || b.Status != events.StatusCompleted || b.Reason != "" {
		t.Fatalf("bundle run %q status %q reason %q", b.RunID, b.Status, b.Reason)
	}
	if !jsonEq(mustMarshal(t, b.Request), mustMarshal(t, fx.Request)) {
		t.Errorf("request = %s\nwant %s", mustMarshal(t, b.Request), mustMarshal(t, fx.Request))
	}
	if len(b.Tools) != 2 || b.Tools[0].Name != "fetch_page" || b.Tools[1].Name != "web_search" {
		t.Fatalf("tools = %s", mustMarshal(t, b.Tools))
	}
	if !jsonEq(b.Tools[1].InputSchema, asCalled.InputSchema) {
		t.Errorf("web_search as called has input_schema %s; want the revision current at the turn, %s", b.Tools[1].InputSchema, asCalled.InputSchema)
	}
	if len(b.Turns) != 2 || b.Turns[0].Iteration != 1 || len(b.Turns[0].Response.ToolCalls) != 2 ||
		b.Turns[1].Response.Content != fx.Outputs.Response || !slices.Equal(b.Turns[0].Tools, fx.Request.Agent.EnabledTools) {
		t.Errorf("turns = %s", mustMarshal(t, b.Turns))
	}
	if !jsonEq(mustMarshal(t, b.Envelopes), mustMarshal(t, fx.Envelopes)) {
		t.Errorf("envelopes = %s", mustMarshal(t, b.Envelopes))
	}
	if b.Outputs == nil || !jsonEq(mustMarshal(t, b.Outputs), mustMarshal(t, fx.Outputs)) {
		t.Errorf("outputs = %s", mustMarshal(t, b.Outputs))
	}
	if len(b.Verdicts) != 2 || !b.Verdicts[0].Allowed || b.Verdicts[1].Iteration != 2 {
		t.Errorf("verdicts = %+v", b.Verdicts)
	}
	// It decodes as the contract's ReplayBundle too.
	var plain envelope.ReplayBundle
	if err := json.Unmarshal(body, &plain); err != nil || plain.RunID != fx.RunID || len(plain.Envelopes) != 2 {
		t.Fatalf("as envelope.ReplayBundle: %v %+v", err, plain)
	}

	// A run whose request has not arrived is not recorded yet: no bundle.
	orphan := storetest.CompletedRun(t, "replay-orphan", "weather", storetest.TenantA, base)
	h.publish(orphan.Event(t, events.TypeRunCompleted, ""))
	h.waitIdle()
	status, body = h.get("/v1/runs/" + orphan.RunID + "/replay")
	if e := decodeError(t, body); status != http.StatusNotFound || e.Code != apitypes.CodeRunNotFound {
		t.Fatalf("replay without request: %d %s", status, body)
	}
	if status, body = h.get("/v1/runs/nope/replay"); status != http.StatusNotFound {
		t.Fatalf("replay of an unknown run: %d %s", status, body)
	}
}

// TestRecorderReplayBundleWaitsForLateEnvelopes: a run's calls are recorded
// apart from the run itself, so a run can read as ended before its last
// envelope is recorded. The run says it has not settled, and its replay
// bundle waits for the envelope instead of leaving it out; a run whose
// envelope never comes gets its bundle after the bound, marked unsettled.
func TestRecorderReplayBundleWaitsForLateEnvelopes(t *testing.T) {
	h := newHarness(t)
	base := time.Now().UTC().Truncate(time.Millisecond)
	fx := storetest.CompletedRun(t, "replay-late", "weather", storetest.TenantA, base)
	var late events.Outgoing
	var early []events.Outgoing
	for _, o := range fx.Events {
		if o.Event.Type() == events.TypeCallCompleted && late.Subject == "" {
			late = o
			continue
		}
		early = append(early, o)
	}
	if late.Subject == "" {
		t.Fatal("the fixture has no completed call")
	}
	h.publish(early...)
	h.waitRun(fx.RunID, events.StatusCompleted, 1)
	h.waitIdle()
	if run := h.getRun(fx.RunID); run.Settled {
		t.Fatalf("a run with a call still waiting for its envelope reads as settled: %+v", run)
	}

	type answer struct {
		settled string
		bundle  envelope.ReplayBundle
		err     error
	}
	fetchBundle := func(runID string) answer {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, h.api.URL+"/v1/runs/"+runID+"/replay", nil)
		if err != nil {
			return answer{err: err}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer func() { _ = resp.Body.Close() }()
		var a answer
		a.settled = resp.Header.Get(api.SettledHeader)
		if resp.StatusCode != http.StatusOK {
			return answer{err: fmt.Errorf("replay: %s", resp.Status)}
		}
		a.err = json.NewDecoder(resp.Body).Decode(&a.bundle)
		return a
	}
	// The bundle asked for now comes once the late envelope is recorded.
	got := make(chan answer, 1)
	go func() { got <- fetchBundle(fx.RunID) }()
	time.Sleep(300 * time.Millisecond) // the request is waiting meanwhile
	select {
	case a := <-got:
		t.Fatalf("the bundle was served without the envelope: %+v", a)
	default:
	}
	h.publish(late)
	a := <-got
	if a.err != nil || a.settled != "true" || len(a.bundle.Envelopes) != 2 {
		t.Fatalf("bundle: err %v, %s %q, %d envelopes; want both, settled", a.err, api.SettledHeader, a.settled, len(a.bundle.Envelopes))
	}
	if run := h.getRun(fx.RunID); !run.Settled {
		t.Fatalf("the run has every envelope but does not read as settled: %+v", run)
	}

	// A run one of whose envelopes never comes: the bundle after the bound,
	// with what was recorded, marked unsettled.
	lost := storetest.CompletedRun(t, "replay-lost", "weather", storetest.TenantA, base)
	skipped := false
	for _, o := range lost.Events {
		if o.Event.Type() == events.TypeCallCompleted && !skipped {
			skipped = true
			continue
		}
		h.publish(o)
	}
	h.waitRun(lost.RunID, events.StatusCompleted, 1)
	h.waitIdle()
	if a := fetchBundle(lost.RunID); a.err != nil || a.settled != "false" || len(a.bundle.Envelopes) != 1 {
		t.Fatalf("bundle: err %v, %s %q, %d envelopes; want the one recorded, unsettled", a.err, api.SettledHeader, a.settled, len(a.bundle.Envelopes))
	}
}

// TestRecorderPins: a handle is served from the run's own calls; when they
// select nothing, on_missing decides - stale_last_success from the last
// successful run of the same agent node (not another tenant's, not a later
// one), null, or error.
func TestRecorderPins(t *testing.T) {
	h := newHarness(t)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	pins := []envelope.PinnedHandle{
		{Name: "search", Selector: envelope.PinSelector{Tool: "web_search"}, OnMissing: envelope.MissingStaleLastSuccess},
		{Name: "page", Selector: envelope.PinSelector{Tool: "fetch_page", Strategy: envelope.PinFirstSuccess}, OnMissing: envelope.MissingNull},
	}
	first := storetest.CompletedRunPinned(t, "pins-1", "weather", storetest.TenantA, base, pins)
	other := storetest.CompletedRunPinned(t, "pins-other-org", "weather", storetest.TenantB, base.Add(time.Minute), pins)
	second := storetest.AnsweredRun(t, "pins-2", "weather", storetest.TenantA, base.Add(2*time.Minute), pins)
	strict := append(slices.Clone(pins), envelope.PinnedHandle{Name: "strict", Selector: envelope.PinSelector{Tool: "web_search"},
		OnMissing: envelope.MissingError})
	running := storetest.StartedRun(t, "pins-running", "weather", storetest.TenantA, base.Add(3*time.Minute)).WithPins(t, strict)
	for _, fx := range []*storetest.Run{first, other, second, running} {
		h.publish(fx.Events...)
	}
	h.waitRun(running.RunID, events.StatusStarted, 0)
	h.waitRun(second.RunID, events.StatusCompleted, 0)
	h.waitIdle()

	pinsOf := func(runID string) apitypes.PinsJSON {
		t.Helper()
		status, body := h.get("/v1/runs/" + runID + "/pins")
		if status != http.StatusOK {
			t.Fatalf("pins of %s: %d %s", runID, status, body)
		}
		return decode[apitypes.PinsJSON](t, body)
	}
	envA, envB := first.Envelopes[0], first.Envelopes[1]

	p := pinsOf(first.RunID)
	if len(p.Pins) != 2 || p.Pins[0].Source != apitypes.PinFromRun || p.Pins[0].Value == nil || p.Pins[0].Value.CallID != envA.CallID {
		t.Fatalf("pins of the first run = %s", mustMarshal(t, p))
	}
	// fetch_page failed: first_success selects nothing, on_missing null.
	if p.Pins[1].Source != apitypes.PinMissing || p.Pins[1].Value != nil || p.Pins[1].OnMissing != envelope.MissingNull {
		t.Fatalf("page pin = %s (the only fetch_page call, %s, failed)", mustMarshal(t, p.Pins[1]), envB.CallID)
	}

	p = pinsOf(second.RunID)
	if got := p.Pins[0]; got.Source != apitypes.PinFromStale || got.FromRunID != first.RunID || got.Value == nil || got.Value.CallID != envA.CallID {
		t.Fatalf("stale pin of the second run = %s; want the first run's web_search envelope", mustMarshal(t, got))
	}
	if got := p.Pins[1]; got.Source != apitypes.PinMissing || got.Value != nil {
		t.Fatalf("null pin = %s", mustMarshal(t, got))
	}

	p = pinsOf(running.RunID)
	if len(p.Pins) != 3 || p.Status != events.StatusStarted {
		t.Fatalf("pins of the running run = %s", mustMarshal(t, p))
	}
	if got := p.Pins[0]; got.Source != apitypes.PinFromStale || got.FromRunID != first.RunID {
		t.Fatalf("stale pin of the running run = %s", mustMarshal(t, got))
	}
	if got := p.Pins[2]; got.Value != nil || got.Source != apitypes.PinMissing || !strings.Contains(got.Error, "on_missing: error") {
		t.Fatalf("error pin = %s", mustMarshal(t, got))
	}

	// A run of another org has no earlier success of its node.
	p = pinsOf(other.RunID)
	if got := p.Pins[0]; got.Source != apitypes.PinFromRun {
		t.Fatalf("other org's search pin = %s", mustMarshal(t, got))
	}
	if status, _ := h.get("/v1/runs/nope/pins"); status != http.StatusNotFound {
		t.Fatalf("pins of an unknown run: %d", status)
	}
}

// TestRecorderCallAndMaterialize: one call with its events, and the same call
// as a standalone tool node: exact version, input, tenant, secret scopes.
func TestRecorderCallAndMaterialize(t *testing.T) {
	h := newHarness(t)
	search := toolDef("web_search", "1.2.0", "search", envelope.SideEffectsReads, `{"type":"object"}`)
	h.register(registry.Entry{Definition: search, UpdatedAt: time.Now().Add(-time.Hour)})
	h.restart()
	fx := storetest.CompletedRun(t, "materialize", "weather", storetest.TenantA, time.Now())
	env := fx.Envelopes[0]
	// The call ran long enough to be announced started, with the scopes its
	// secrets came from (a quick call has no started event).
	s, err := events.NewCallStarted(storetest.Source, events.CallStarted{RunID: fx.RunID, CallID: env.CallID,
		Name: env.Name, Version: env.Version, TStart: env.TStart, Executor: "executor-0",
		SecretScopes: map[string]string{"SEARCH_API_KEY": "workspace", "SEARCH_ORG_TOKEN": "org"},
		Warnings:     []string{"secret SEARCH_ORG_TOKEN fell back to the org scope"}}, fx.Tenant, fx.Trace)
	if err != nil {
		t.Fatal(err)
	}
	s.Event.SetTime(env.TStart)
	fx.Events = append(fx.Events, s)
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitIdle()

	status, body := h.get("/v1/runs/" + fx.RunID + "/calls/" + env.CallID)
	if status != http.StatusOK {
		t.Fatalf("call: %d %s", status, body)
	}
	c := decode[apitypes.CallJSON](t, body)
	var types []string
	for _, e := range c.Events {
		types = append(types, e.Type)
	}
	if c.CallID != env.CallID || c.Name != env.Name || !jsonEq(c.Input, env.Input) || !jsonEq(c.Envelope, mustMarshal(t, env)) ||
		len(types) != 3 || !slices.Contains(types, events.TypeCallApproved) || !slices.Contains(types, events.TypeCallStarted) {
		t.Fatalf("call = %s", body)
	}

	status, body = h.get("/v1/runs/" + fx.RunID + "/calls/" + env.CallID + "/materialize")
	if status != http.StatusOK {
		t.Fatalf("materialize: %d %s", status, body)
	}
	m := decode[apitypes.MaterializedCallJSON](t, body)
	if m.Kind != "tool_node" || m.Tool != "web_search" || m.Version != "1.2.0" || m.Ref != "web_search@1.2.0" ||
		!jsonEq(m.Input, env.Input) || m.Tenant != fx.Tenant {
		t.Fatalf("materialized = %s", body)
	}
	if !reflect.DeepEqual(m.SecretScopes, map[string]string{"SEARCH_API_KEY": "workspace", "SEARCH_ORG_TOKEN": "org"}) || m.SecretScope != "org" {
		t.Fatalf("secret scopes = %v (broadest %q)", m.SecretScopes, m.SecretScope)
	}
	if !jsonEq(m.Definition, mustMarshal(t, search)) {
		t.Fatalf("definition = %s", m.Definition)
	}
	wantCmd := []string{"toolwire", "call", "web_search@1.2.0", "--input", `{"max_results":3,"query":"weather in Paris"}`,
		"--org", "org-a", "--workspace", "ws-1", "--user", "user-1"}
	if !slices.Equal(m.Command, wantCmd) {
		t.Fatalf("command = %q\nwant %q", m.Command, wantCmd)
	}
	if m.Source.RunID != fx.RunID || m.Source.CallID != env.CallID || m.Source.Seq == nil || *m.Source.Seq != 1 || m.Source.Agent != "weather" {
		t.Fatalf("source = %+v", m.Source)
	}

	for _, c := range []struct {
		path   string
		status int
		code   string
	}{
		{"/v1/runs/" + fx.RunID + "/calls/XYZ", 400, apitypes.CodeInvalidCallID},
		{"/v1/runs/" + fx.RunID + "/calls/abcdef/materialize", 404, apitypes.CodeCallNotFound},
		{"/v1/runs/nope/calls/abcdef", 404, apitypes.CodeRunNotFound},
	} {
		status, body := h.get(c.path)
		if e := decodeError(t, body); status != c.status || e.Code != c.code {
			t.Errorf("GET %s = %d %s; want %d %s", c.path, status, body, c.status, c.code)
		}
	}
}

// TestRecorderListRunsFilters: tenant, workspace, agent, status and time
// range, and the rejection of malformed filters.
func TestRecorderListRunsFilters(t *testing.T) {
	h := newHarness(t)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	runs := []*storetest.Run{
		storetest.CompletedRun(t, "f-1", "weather", storetest.TenantA, base),
		storetest.FailedRun(t, "f-2", "weather", storetest.TenantB, base.Add(time.Minute), "boom"),
		storetest.CompletedRun(t, "f-3", "travel", storetest.TenantA, base.Add(2*time.Minute)),
	}
	for _, fx := range runs {
		h.publish(fx.Events...)
	}
	h.waitRun("f-3", events.StatusCompleted, 2)
	h.waitRun("f-2", events.StatusFailed, 0)
	h.waitIdle()
	ts := func(d time.Duration) string { return url.QueryEscape(base.Add(d).Format(time.RFC3339Nano)) }
	for q, want := range map[string][]string{
		"?tenant=org-a":                                    {"f-3", "f-1"},
		"?tenant=org-b/ws-2":                               {"f-2"},
		"?tenant=org-a/ws-1/user-1&agent=travel":           {"f-3"},
		"?workspace_id=ws-1&status=completed":              {"f-3", "f-1"},
		"?since=" + ts(30*time.Second):                     {"f-3", "f-2"},
		"?until=" + ts(30*time.Second):                     {"f-1"},
		"?since=" + ts(0) + "&until=" + ts(90*time.Second): {"f-2", "f-1"},
		"?user_id=user-2":                                  {"f-2"},
	} {
		status, body := h.get("/v1/runs" + q)
		if status != http.StatusOK {
			t.Fatalf("list %s: %d %s", q, status, body)
		}
		var ids []string
		for _, r := range decode[apitypes.RunListJSON](t, body).Runs {
			ids = append(ids, r.RunID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("list %s = %v, want %v", q, ids, want)
		}
	}
	for _, q := range []string{"?since=yesterday", "?until=2026-13-01T00:00:00Z", "?since=" + ts(time.Minute) + "&until=" + ts(0),
		"?tenant=a/b/c/d", "?tenant=org-a&org_id=org-b", "?tenant=/ws"} {
		status, body := h.get("/v1/runs" + q)
		if e := decodeError(t, body); status != http.StatusBadRequest || e.Code != apitypes.CodeInvalidParameter {
			t.Errorf("list %s = %d %s; want 400 invalid_parameter", q, status, body)
		}
	}
}

// streamedEvent is what the tests read of a live stream's CloudEvent.
type streamedEvent struct {
	SpecVersion string          `json:"specversion"`
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	RunID       string          `json:"runid"`
	CallID      string          `json:"callid"`
	Data        json.RawMessage `json:"data"`
}

// sseEvent is one Server-Sent Event as read off the wire.
type sseEvent struct {
	ID, Event, Data string
}

// sseStream reads a live stream.
type sseStream struct {
	resp *http.Response
	r    *bufio.Reader
}

func (h *harness) stream(runID, lastEventID string) *sseStream {
	h.t.Helper()
	req, err := http.NewRequestWithContext(testCtx(h.t), http.MethodGet, h.api.URL+"/v1/runs/"+runID+"/events/stream", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("stream %s: %d %s %s", runID, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return &sseStream{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next returns the next event (not comments or the retry hint), or io.EOF.
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.Data != "" || ev.Event != "" {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"), strings.HasPrefix(line, "retry:"):
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.Event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data += strings.TrimPrefix(line, "data: ")
		}
	}
}

func (s *sseStream) close() { _ = s.resp.Body.Close() }

// TestRecorderEventStream: the live stream sends what is recorded, then new
// events as they are recorded; after a reconnect with Last-Event-ID it resumes
// exactly after the last event received, and it ends once the run has ended.
func TestRecorderEventStream(t *testing.T) {
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "stream", "weather", storetest.TenantA, time.Now())
	const early = 6
	h.publish(fx.Events[:early]...)
	eventually(t, "the first events to be recorded", func() (bool, string) {
		status, body := h.get("/v1/runs/" + fx.RunID + "/events")
		if status != http.StatusOK {
			return false, string(body)
		}
		return len(decode[apitypes.EventsJSON](t, body).Events) == early, string(body)
	})

	seen := map[string]bool{}
	read := func(s *sseStream) (streamedEvent, sseEvent) {
		t.Helper()
		ev, err := s.next()
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if ev.Event != "" {
			return streamedEvent{}, ev
		}
		row := decode[streamedEvent](t, []byte(ev.Data))
		if _, err := strconv.ParseInt(ev.ID, 10, 64); err != nil {
			t.Fatalf("SSE id %q is not a seq", ev.ID)
		}
		if seen[row.ID] {
			t.Fatalf("event %s sent twice", row.ID)
		}
		seen[row.ID] = true
		return row, ev
	}

	s := h.stream(fx.RunID, "")
	var last sseEvent
	for range early {
		_, last = read(s)
	}
	s.close() // the client goes away

	// Reconnect where it left off, then the rest of the run happens.
	s = h.stream(fx.RunID, last.ID)
	h.publish(fx.Events[early:]...)
	for len(seen) < len(fx.Events) {
		row, ev := read(s)
		if ev.Event != "" {
			t.Fatalf("stream ended (%s %s) after %d of %d events", ev.Event, ev.Data, len(seen), len(fx.Events))
		}
		if row.RunID != fx.RunID {
			t.Fatalf("event of run %q in the stream of %q", row.RunID, fx.RunID)
		}
	}
	_, end := read(s)
	if end.Event != "end" || !jsonEq([]byte(end.Data), []byte(`{"run_id":"stream","status":"completed"}`)) {
		t.Fatalf("final event = %+v; want end with status completed", end)
	}
	if _, err := s.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after end: %v, want EOF", err)
	}
	for _, o := range fx.Events {
		if !seen[o.Event.ID()] {
			t.Errorf("event %s never streamed", o.Event.ID())
		}
	}

	// Reconnecting after the end sends nothing more, just the end.
	s = h.stream(fx.RunID, strconv.Itoa(1<<30))
	if ev, err := s.next(); err != nil || ev.Event != "end" {
		t.Fatalf("stream after the end: %+v %v", ev, err)
	}

	for path, want := range map[string]int{
		"/v1/runs/a.b/events/stream":      http.StatusBadRequest,
		"/v1/runs/stream/events?after=-1": http.StatusBadRequest,
		"/v1/runs/stream/events?limit=x":  http.StatusBadRequest,
	} {
		if status, body := h.get(path); status != want {
			t.Errorf("GET %s = %d %s, want %d", path, status, body, want)
		}
	}
	// A run that is never recorded: the stream waits for it (StreamWait),
	// then says so.
	s = h.stream("nope", "")
	if ev, err := s.next(); err != nil || ev.Event != "error" || decodeError(t, []byte(ev.Data)).Code != apitypes.CodeRunNotFound {
		t.Fatalf("stream of a run never recorded: %+v %v; want an error event run_not_found", ev, err)
	}
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, h.api.URL+"/v1/runs/stream/events/stream", nil)
	req.Header.Set("Last-Event-ID", "yesterday")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad Last-Event-ID: %d", resp.StatusCode)
	}
}

// restart stops the recorder and starts a new one on the same database and
// consumers.
func (h *harness) restart() {
	h.t.Helper()
	h.stop()
	h.start()
}

// TestEventStreamOfARefusedRunEnds: a run whose request the recorder could
// not keep (refused, dead-lettered) is no run, but the orchestrator's failed
// event for it is recorded: its live stream shows it and ends, and so does a
// stream that reconnects after it.
func TestEventStreamOfARefusedRunEnds(t *testing.T) {
	h := newHarness(t)
	o, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "refused-1", Status: events.StatusFailed,
		Reason: "the run request cannot be decoded: ..."}, "", events.RunTrace{})
	if err != nil {
		t.Fatal(err)
	}
	h.publish(o)
	h.waitIdle()
	if status, body := h.get("/v1/runs/refused-1"); status != http.StatusNotFound {
		t.Fatalf("a run never requested: %d %s; want 404", status, body)
	}
	s := h.stream("refused-1", "")
	ev, err := s.next()
	if err != nil || ev.Event != "" || decode[streamedEvent](t, []byte(ev.Data)).Type != events.TypeRunFailed {
		t.Fatalf("first streamed: %+v %v; want the failed event", ev, err)
	}
	for _, after := range []string{"", ev.ID} {
		if after != "" {
			s = h.stream("refused-1", after)
		}
		if ev, err = s.next(); err != nil || ev.Event != "end" || !jsonEq([]byte(ev.Data), []byte(`{"run_id":"refused-1","status":"failed"}`)) {
			t.Fatalf("stream (after %q): %+v %v; want its end", after, ev, err)
		}
	}
}

// TestEventStreamEndsWhenTheRecorderStops: a live stream of a run in progress
// ends when the recorder stops, so that the HTTP server's shutdown does not
// wait for its clients.
func TestEventStreamEndsWhenTheRecorderStops(t *testing.T) {
	h := newHarness(t)
	fx := storetest.StartedRun(t, "stream-stop", "weather", storetest.TenantA, time.Now())
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusStarted, 0)
	s := h.stream(fx.RunID, "")
	for range fx.Events {
		if _, err := s.next(); err != nil {
			t.Fatal(err)
		}
	}
	h.stop()
	if ev, err := s.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the recorder stopped: %+v %v, want the end of the stream", ev, err)
	}
}

// TestRecorderTurns: each iteration of a run with the loop rules' verdict,
// the model's response and cost, and the calls its turn made; a denied turn
// has a verdict and no response.
func TestRecorderTurns(t *testing.T) {
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "turns", "weather", storetest.TenantA, time.Now())
	denied := storetest.FailedRun(t, "turns-denied", "weather", storetest.TenantA, time.Now(), "max_budget reached")
	h.publish(fx.Events...)
	h.publish(denied.Events...)
	h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitRun(denied.RunID, events.StatusFailed, 0)
	h.waitIdle()

	got := fetch[apitypes.TurnsJSON](h, "/v1/runs/"+fx.RunID+"/turns")
	if got.RunID != fx.RunID || len(got.Turns) != 2 {
		t.Fatalf("turns = %s", mustMarshal(t, got))
	}
	for i, tj := range got.Turns {
		want, _ := fx.Turn(t, i+1) // the last one rode on the completed event
		if tj.Iteration != i+1 || tj.Verdict == nil || !tj.Verdict.Allowed || tj.Model == nil || tj.Model.Name != "script-1" ||
			tj.Response == nil || !jsonEq(mustMarshal(t, tj.Response), mustMarshal(t, want.Response)) ||
			tj.Cost == nil || *tj.Cost != want.Cost || tj.Spend == nil || *tj.Spend != want.Spend ||
			!slices.Equal(tj.Tools, fx.Request.Agent.EnabledTools) || tj.TStart == nil || !tj.TStart.Equal(want.TStart) {
			t.Errorf("turn %d = %s\nsent %s", i+1, mustMarshal(t, tj), mustMarshal(t, want))
		}
	}
	if calls := got.Turns[0].Calls; !slices.Equal(calls, []string{fx.Envelopes[0].CallID, fx.Envelopes[1].CallID}) {
		t.Errorf("turn 1 calls = %v", calls)
	}
	if calls := got.Turns[1].Calls; len(calls) != 0 {
		t.Errorf("turn 2 calls = %v; want none", calls)
	}

	got = fetch[apitypes.TurnsJSON](h, "/v1/runs/"+denied.RunID+"/turns")
	if len(got.Turns) != 1 {
		t.Fatalf("turns of the denied run: %s", mustMarshal(t, got))
	}
	if d := got.Turns[0]; d.Verdict == nil || d.Verdict.Allowed || d.Verdict.Code != string(envelope.CodePolicyDenied) ||
		d.Verdict.Reason != "max_budget reached" || d.Response != nil {
		t.Fatalf("denied turn = %s", mustMarshal(t, d))
	}
	if status, body := h.get("/v1/runs/nope/turns"); status != http.StatusNotFound {
		t.Fatalf("turns of an unknown run: %d %s", status, body)
	}
}

// TestRecorderOutputsInABlob: a completed run whose outputs were too large
// for its event names their blob; the API reads it wherever the outputs are
// needed (outputs, pins, replay bundle), and says so when the blob is gone.
func TestRecorderOutputsInABlob(t *testing.T) {
	h := newHarness(t)
	pins := []envelope.PinnedHandle{{Name: "search", Selector: envelope.PinSelector{Tool: "web_search"}}}
	fx := storetest.CompletedRunPinned(t, "in-blob", "weather", storetest.TenantA, time.Now(), pins)
	var done events.RunStatus
	if err := json.Unmarshal(fx.Event(t, events.TypeRunCompleted, "").Event.Data(), &done); err != nil {
		t.Fatal(err)
	}
	doc := mustMarshal(t, events.OutputsDocument{Outputs: done.Outputs, Pinned: done.Pinned})
	att, err := blobs.Put(testCtx(t), h.env.JS, fx.RunID+".outputs", doc, "application/json")
	if err != nil {
		t.Fatal(err)
	}
	fx = fx.WithOutputsBlob(t, att)
	gone := storetest.CompletedRun(t, "blob-gone", "weather", storetest.TenantA, time.Now()).WithOutputsBlob(t,
		envelope.Attachment{Kind: envelope.AttachmentBlob, URL: blobs.URL("blob-gone.outputs")})
	h.publish(fx.Events...)
	h.publish(gone.Events...)
	run := h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitRun(gone.RunID, events.StatusCompleted, 2)
	h.waitIdle()

	if run.OutputsBlob == nil || run.OutputsBlob.URL != att.URL || run.Pinned != nil {
		t.Fatalf("run = outputs_blob %+v pinned %s; want the blob named, no pinned handles inline", run.OutputsBlob, run.Pinned)
	}
	status, body := h.get("/v1/runs/" + fx.RunID + "/outputs")
	if status != http.StatusOK || !jsonEq(body, mustMarshal(t, fx.Outputs)) {
		t.Fatalf("outputs: %d %s\nwant %s", status, body, mustMarshal(t, fx.Outputs))
	}
	if p := fetch[apitypes.PinsJSON](h, "/v1/runs/"+fx.RunID+"/pins"); len(p.Pins) != 1 || p.Pins[0].Source != apitypes.PinFromRun ||
		p.Pins[0].Value == nil || p.Pins[0].Value.CallID != fx.Envelopes[0].CallID {
		t.Fatalf("pins: %s", mustMarshal(t, p))
	}
	if b := fetch[envelope.ReplayBundle](h, "/v1/runs/"+fx.RunID+"/replay"); b.Outputs == nil ||
		!jsonEq(mustMarshal(t, b.Outputs), mustMarshal(t, fx.Outputs)) || b.Version != envelope.ReplayBundleVersion {
		t.Fatalf("replay: %s", mustMarshal(t, b))
	}
	for _, path := range []string{"/outputs", "/replay"} {
		status, body = h.get("/v1/runs/" + gone.RunID + path)
		if e := decodeError(t, body); status != http.StatusNotFound || e.Code != apitypes.CodeBlobNotFound {
			t.Errorf("%s of a run whose blob is gone: %d %s; want 404 %s", path, status, body, apitypes.CodeBlobNotFound)
		}
	}
}
