package rerun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
)

// maxBundleBytes bounds a bundle read from a recorder.
const maxBundleBytes = 256 << 20

// FromRecorder fetches a run's bundle from a recorder's API (base is its URL,
// such as http://127.0.0.1:8088).
func FromRecorder(ctx context.Context, base, runID string) (Bundle, error) {
	if err := events.ValidateRunID(runID); err != nil {
		return Bundle{}, err
	}
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Bundle{}, fmt.Errorf("recorder URL %q: want http(s)://host:port", base)
	}
	u = u.JoinPath("v1", "runs", runID, "replay")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Bundle{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Bundle{}, fmt.Errorf("fetch the replay bundle of %s: %w", runID, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBundleBytes))
	if err != nil {
		return Bundle{}, fmt.Errorf("fetch the replay bundle of %s: %w", runID, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e apitypes.ErrorJSON
		if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
			return Bundle{}, fmt.Errorf("recorder at %s: %s (%s)", base, e.Error.Message, e.Error.Code)
		}
		return Bundle{}, fmt.Errorf("recorder at %s answered %s", base, resp.Status)
	}
	return decodeBundle(body)
}

// ReadBundle reads a bundle as JSON (a file saved from GET
// /v1/runs/{run_id}/replay), refusing one of a version this build cannot
// read.
func ReadBundle(r io.Reader) (Bundle, error) {
	body, err := io.ReadAll(io.LimitReader(r, maxBundleBytes+1))
	if err != nil {
		return Bundle{}, fmt.Errorf("read the replay bundle: %w", err)
	}
	if len(body) > maxBundleBytes {
		return Bundle{}, fmt.Errorf("%w: larger than %d MiB", ErrBundle, maxBundleBytes>>20)
	}
	return decodeBundle(body)
}

// decodeBundle decodes a bundle and checks its version: fields of a newer
// version would be silently dropped, so its version is checked first.
func decodeBundle(body []byte) (Bundle, error) {
	var b Bundle
	if err := json.Unmarshal(body, &b); err != nil {
		return Bundle{}, fmt.Errorf("%w: %w", ErrBundle, err)
	}
	if err := CheckVersion(b); err != nil {
		return Bundle{}, err
	}
	return b, nil
}
