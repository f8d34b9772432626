// Package apiclient holds what programs that read a recorder's HTTP API
// (the CLI, the bench) share: waiting for a run to be recorded whole.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
)

// requestTimeout bounds each request of WaitSettled: one that hangs must not
// use up the whole wait.
const requestTimeout = 2 * time.Second

// maxRunBytes bounds a run's answer read by WaitSettled.
const maxRunBytes = 64 << 20

// WaitSettled asks the recorder at base (such as http://127.0.0.1:8088) for
// run runID every poll until it answers that the run has settled: ended, with
// every tool call's envelope recorded (GET /v1/runs/{run_id}, field settled).
// The recorder records a run's calls apart from the run itself, so a run read
// as ended may still lack its last calls; a caller that shows or measures the
// whole run waits for this. It returns the settled run, or ctx's error with the
// last answer when ctx ends first (ctx bounds the wait).
func WaitSettled(ctx context.Context, base, runID string, poll time.Duration) (apitypes.RunDetailJSON, error) {
	if err := events.ValidateRunID(runID); err != nil {
		return apitypes.RunDetailJSON{}, err
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return apitypes.RunDetailJSON{}, fmt.Errorf("recorder URL %q: want http(s)://host:port", base)
	}
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	u = u.JoinPath("v1", "runs", runID)
	last := "no answer yet"
	ended := func() error {
		return fmt.Errorf("run %s not recorded whole (last answer: %s): %w", runID, last, ctx.Err())
	}
	for {
		run, answer, err := getRun(ctx, u.String())
		var refused *refusedError
		switch {
		case err == nil && run.Settled:
			return run, nil
		case ctx.Err() != nil:
			// The wait's own end cut the request short: the last answer
			// is the one before, not this cancellation.
			return apitypes.RunDetailJSON{}, ended()
		case errors.As(err, &refused):
			return apitypes.RunDetailJSON{}, fmt.Errorf("run %s: the recorder at %s refused: %w", runID, base, err)
		case err != nil:
			last = err.Error()
		default:
			last = answer
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return apitypes.RunDetailJSON{}, ended()
		case <-t.C:
		}
	}
}

// refusedError is an answer that waiting will not change.
type refusedError struct{ status, body string }

func (e *refusedError) Error() string { return e.status + ": " + e.body }

// getRun reads a run; answer says how it stands when it has not settled.
func getRun(ctx context.Context, u string) (apitypes.RunDetailJSON, string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return apitypes.RunDetailJSON{}, "", err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return apitypes.RunDetailJSON{}, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		// A run not recorded yet is 404, a recorder starting 5xx: wait on.
		// Any other 4xx (a token missing or refused, a bad request) will not
		// change by waiting.
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusNotFound &&
			resp.StatusCode != http.StatusTooManyRequests {
			return apitypes.RunDetailJSON{}, "", &refusedError{status: resp.Status, body: string(bytes.TrimSpace(body))}
		}
		return apitypes.RunDetailJSON{}, "", errors.New(resp.Status)
	}
	var run apitypes.RunDetailJSON
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRunBytes)).Decode(&run); err != nil {
		return apitypes.RunDetailJSON{}, "", fmt.Errorf("run: %w", err)
	}
	done := 0
	for _, c := range run.ToolCalls {
		if c.Status == events.CallStatusCompleted {
			done++
		}
	}
	return run, fmt.Sprintf("status %s, %d of %d calls recorded completed", run.Status, done, run.Counts.ToolCalls), nil
}
