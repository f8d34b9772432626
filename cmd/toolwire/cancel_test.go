package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// TestCancelCommand, end to end on a stack: a run waiting for an operator's
// decision is cancelled with `toolwire cancel --wait`: its approval is
// withdrawn (a late `toolwire approve` is refused), it ends cancelled with
// the call's envelope saying so (exit status 3, its status JSON on
// stdout); cancelling it again prints how it ended; an unknown run is exit
// status 6.
func TestCancelCommand(t *testing.T) {
	dir := t.TempDir()
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(sqlite.URL(filepath.Join(dir, "recorder.db")))})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	waiting := demo.Request("cancel-waiting")
	waiting.Agent.Policy.RequireApproval = &envelope.ApprovalPolicy{Tools: []string{"echo"}}
	_, _, err = runCLIUntil(t, "waits for an operator", "run", "-f", writeRequest(t, waiting), "--nats", st.URL, "--timeout", "30s")
	require.Equal(t, exitInterrupted, exitCode(err), "interrupted once the call awaits its decision: %v", err)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := st.JS.KeyValue(ctx, events.BucketApprovals)
	require.NoError(t, err)
	keys, err := kv.ListKeysFiltered(ctx, waiting.RunID+".*")
	require.NoError(t, err)
	var callID string
	for k := range keys.Keys() {
		callID = k[len(waiting.RunID)+1:]
	}
	require.NotEmpty(t, callID, "the call awaits its decision")

	out, errOut, err := runCLI(t, "", "cancel", waiting.RunID, "--reason", "wrong customer", "--by", "alice", "--wait", "--nats", st.URL)
	require.Error(t, err)
	require.Equal(t, exitRunFailed, exitCode(err), "%v\n%s", err, errOut)
	require.Contains(t, errOut, "cancel requested")
	var status events.RunStatus
	require.NoError(t, json.Unmarshal([]byte(out), &status), out)
	require.Equal(t, events.StatusCancelled, status.Status)
	require.Equal(t, "cancelled by alice: wrong customer", status.Reason)
	require.NotNil(t, status.Outputs)
	env := status.Outputs.ToolsByID[callID]
	require.NotNil(t, env.Error, "%+v", status.Outputs)
	require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
	require.True(t, events.IsCancelledCall(env.Error))

	_, errOut, err = runCLI(t, "", "approve", waiting.RunID, callID, "--nats", st.URL)
	require.ErrorIs(t, err, approvals.ErrAlreadyDecided, errOut)
	require.ErrorContains(t, err, "withdrawn: the run was cancelled by alice: wrong customer")

	out, _, err = runCLI(t, "", "cancel", waiting.RunID, "--nats", st.URL)
	require.NoError(t, err)
	var again client.Cancelled
	require.NoError(t, json.Unmarshal([]byte(out), &again), out)
	require.Equal(t, client.Cancelled{RunID: waiting.RunID, Status: events.StatusCancelled}, again)

	_, _, err = runCLI(t, "", "cancel", "cancel-nobody", "--nats", st.URL)
	require.Equal(t, exitNotFound, exitCode(err), "%v", err)
}
