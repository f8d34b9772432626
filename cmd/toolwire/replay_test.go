package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/rerun"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// TestReplayCommand: the demo run, recorded on SQLite, replays clean from the
// recorder and from its database; a tampered recording (a model response
// that no longer matches the recorded call) exits 1 naming the step.
func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	dbURL := sqlite.URL(filepath.Join(dir, "recorder.db"))
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(dbURL)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	runID := "replay-cli-demo"
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, demo.Request(runID)))
	final, err := st.Client.Follow(ctx, runID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Eventually(t, func() bool {
		resp, err := http.Get(st.HTTPURL + "/v1/runs/" + runID + "/replay")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		var b rerun.Bundle
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&b) == nil &&
			len(b.Envelopes) == 4 && b.Status == events.StatusCompleted && len(b.Tools) == 3
	}, 30*time.Second, 20*time.Millisecond)

	out, errOut, err := runCLI(t, "", "replay", runID, "--recorder", st.HTTPURL)
	require.NoError(t, err, errOut+out)
	require.Contains(t, errOut, "replaying run "+runID+" (3 model turns, 4 tool calls, completed)")
	require.Contains(t, out, "✓ step 1   model turn 1")
	require.Contains(t, out, "tool call #4 (iteration 2, calculator@1.0.0)  [recorded]")
	require.Contains(t, out, "clean: this build makes the same decisions (8 steps, run completed)")

	out, errOut, err = runCLI(t, "", "replay", runID, "--database-url", dbURL, "--json")
	require.NoError(t, err, errOut)
	var rep rerun.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.Clean)
	require.Len(t, rep.Steps, 8)

	// Tamper with the recording: the second model turn now asks for another
	// calculation than the one recorded.
	s, err := sqlite.Open(dbURL)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	var raw string
	require.NoError(t, s.DB().QueryRowContext(ctx, `SELECT turn FROM model_turns WHERE run_id = ?1 AND iteration = 2`, runID).Scan(&raw))
	var turn events.Turn // the data of the turn's event, as recorded
	require.NoError(t, json.Unmarshal([]byte(raw), &turn))
	turn.Response.ToolCalls[0].Arguments = json.RawMessage(`{"expression":43}`)
	b, err := json.Marshal(turn)
	require.NoError(t, err)
	_, err = s.DB().ExecContext(ctx, `UPDATE model_turns SET turn = ?1 WHERE run_id = ?2 AND iteration = 2`, string(b), runID)
	require.NoError(t, err)

	out, errOut, err = runCLI(t, "", "replay", runID, "--database-url", dbURL)
	require.ErrorIs(t, err, errDiverged, out+errOut)
	require.Contains(t, err.Error(), "first difference at step 6, tool call #4 (iteration 2, calculator@1.0.0)")
	require.Contains(t, out, "✗ step 6   tool call #4 (iteration 2, calculator@1.0.0)")
	require.Contains(t, out, `calculator@1.0.0 {"expression":42}`)
	require.Contains(t, out, `calculator@1.0.0 {"expression":43}`)
	require.Contains(t, out, "DIVERGED at step 6")

	for _, args := range [][]string{
		{"replay"},
		{"replay", "bad id!", "--recorder", st.HTTPURL},
		{"replay", runID, "--recorder", st.HTTPURL, "--database-url", dbURL},
		{"replay", runID, "--bundle", "x.json", "--database-url", dbURL},
		{"replay", "no-such-run", "--recorder", st.HTTPURL},
		{"replay", "no-such-run", "--database-url", dbURL},
		{"replay", runID, "--database-url", sqlite.URL(filepath.Join(t.TempDir(), "none.db"))},
	} {
		_, _, err := runCLI(t, "", args...)
		require.Error(t, err, "%v", args)
		require.False(t, strings.Contains(err.Error(), "diverged"), "%v: %v", args, err)
	}
}

// TestReplayBundleFiles: a saved bundle replays from its file, a version 1
// bundle (recorded before contract v2) too; a newer version is refused with
// both versions named, before anything runs.
func TestReplayBundleFiles(t *testing.T) {
	out, errOut, err := runCLI(t, "", "replay", "replay-v1-demo", "--bundle", "../../rerun/testdata/v1-demo-bundle.json")
	require.NoError(t, err, errOut+out)
	require.Contains(t, errOut, "replaying run replay-v1-demo (3 model turns, 4 tool calls, completed)")
	require.Contains(t, out, "clean: this build makes the same decisions (8 steps, run completed)")

	b, err := os.ReadFile("../../rerun/testdata/v1-demo-bundle.json")
	require.NoError(t, err)
	out, errOut, err = runCLI(t, string(b), "replay", "replay-v1-demo", "--bundle", "-", "--json")
	require.NoError(t, err, errOut)
	var rep rerun.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.Clean)

	_, _, err = runCLI(t, "", "replay", "replay-v3-demo", "--bundle", "../../rerun/testdata/v3-bundle.json")
	require.ErrorIs(t, err, rerun.ErrBundleVersion)
	require.ErrorContains(t, err, "of version 3, newer than this build reads (versions 1 to 2)")
	_, _, err = runCLI(t, "", "replay", "another-run", "--bundle", "../../rerun/testdata/v1-demo-bundle.json")
	require.ErrorContains(t, err, `holds the bundle of run "replay-v1-demo", not "another-run"`)
}
