package recorder_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestOutputsWait: GET /v1/runs/{id}/outputs?wait= answers a run's outputs
// as soon as its end is stored, the same document the recorder serves once
// it has recorded the run; a failed run's end is 409 run_failed with its
// reason; a run that does not end within the wait is 409
// run_not_completed; another tenant's run, or an unknown one, is 404 as
// without wait; a bad wait is 400.
func TestOutputsWait(t *testing.T) {
	w := newWritesEnv(t)
	done := storetest.CompletedRun(t, "waited", "weather", storetest.TenantA, time.Now())
	failed := storetest.FailedRun(t, "waited-fail", "weather", storetest.TenantA, time.Now(), "model call failed: 500")
	running := storetest.StartedRun(t, "waited-long", "weather", storetest.TenantA, time.Now())
	isEnd := func(typ string) bool { return events.IsEndType(typ) }
	for _, fx := range []*storetest.Run{done, failed} {
		for _, o := range fx.Events {
			if !isEnd(o.Event.Type()) {
				w.env.Publish(t, o)
			}
		}
	}
	w.env.Publish(t, running.Events...)

	type answer struct {
		status int
		body   []byte
	}
	wait := func(who, path string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			status, body := w.get(who, path)
			ch <- answer{status, body}
		}()
		return ch
	}
	got := wait("producer A", "/v1/runs/waited/outputs?wait=20s")
	gotFailed := wait("producer A", "/v1/runs/waited-fail/outputs?wait=20s")
	// The ends come while the waits are on (or before they look: either
	// way they are answered from the end).
	for _, fx := range []*storetest.Run{done, failed} {
		for _, o := range fx.Events {
			if isEnd(o.Event.Type()) {
				w.env.Publish(t, o)
			}
		}
	}
	a := <-got
	if a.status != http.StatusOK {
		t.Fatalf("outputs?wait of a run that completes: %d %s", a.status, a.body)
	}
	var outputs map[string]any
	if err := json.Unmarshal(a.body, &outputs); err != nil || outputs["response"] == nil {
		t.Fatalf("outputs?wait: %s (%v); want the AgentOutputs", a.body, err)
	}
	eventually(t, "the recorded outputs to be those the wait answered", func() (bool, string) {
		status, body := w.get("producer A", "/v1/runs/waited/outputs")
		return status == http.StatusOK && jsonEq(body, a.body), string(body)
	})
	if a := <-gotFailed; a.status != http.StatusConflict || decodeError(t, a.body).Code != apitypes.CodeRunFailed ||
		!strings.Contains(string(a.body), "model call failed: 500") {
		t.Fatalf("outputs?wait of a run that fails: %d %s; want 409 run_failed with its reason", a.status, a.body)
	}

	for _, tc := range []struct {
		who, path string
		status    int
		code      string
	}{
		{"producer A", "/v1/runs/waited-long/outputs?wait=300ms", http.StatusConflict, apitypes.CodeRunNotCompleted},
		{"producer B", "/v1/runs/waited/outputs?wait=5s", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"producer B", "/v1/runs/waited-long/outputs?wait=5s", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"producer A", "/v1/runs/never-was/outputs?wait=5s", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"producer A", "/v1/runs/waited/outputs?wait=soon", http.StatusBadRequest, apitypes.CodeInvalidParameter},
		{"producer A", "/v1/runs/waited/outputs?wait=-1s", http.StatusBadRequest, apitypes.CodeInvalidParameter},
		{"producer A", "/v1/runs/waited/outputs?wait=2m", http.StatusBadRequest, apitypes.CodeInvalidParameter},
	} {
		status, body := w.get(tc.who, tc.path)
		if status != tc.status || decodeError(t, body).Code != tc.code {
			t.Errorf("GET %s as %s: %d %s; want %d %s", tc.path, tc.who, status, body, tc.status, tc.code)
		}
	}
}
