package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the binary's wiring against an embedded server: a call goes
// through, and cancelling the context shuts the service down cleanly.
func TestRun(t *testing.T) {
	env := eventstest.Start(t)
	stop := servicetest.Run(t, "executor", ":8083", map[string]string{
		service.EnvNATSURL:      env.URL,
		service.EnvHTTPAddr:     "127.0.0.1:0",
		executor.EnvConcurrency: "4",
	}, service.Builder(standard.Build))

	input := json.RawMessage(`{"expression":"6*7"}`)
	callID, err := envelope.CallID("calculator", "1.0.0", input, 1)
	require.NoError(t, err)
	req := events.CallRequest{
		RunID: "run-main", CallID: callID, Seq: 1, Iteration: 1, Name: "calculator", Version: "1.0.0",
		Input: input, Tenant: envelope.Tenant{OrgID: "acme"}, Agent: "a", Queue: envelope.DefaultQueue,
	}
	out, err := events.NewCallApproved("/toolwire/test", req, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, out)

	subj, err := events.CallSubject(req.RunID, req.CallID, "completed")
	require.NoError(t, err)
	ev, _ := env.Next(t, events.StreamCalls, 30*time.Second, subj)
	var got envelope.ToolEnvelope
	require.NoError(t, events.DecodeData(ev, &got))
	require.Nil(t, got.Error)
	require.JSONEq(t, `{"result":42}`, string(got.Output))

	require.NoError(t, stop())
}

func TestRunRejectsBadConfig(t *testing.T) {
	env := eventstest.Start(t)
	getenv := servicetest.Getenv(map[string]string{
		service.EnvNATSURL:      env.URL,
		service.EnvHTTPAddr:     "127.0.0.1:0",
		executor.EnvConcurrency: "lots",
	})
	err := service.Run(t.Context(), "executor", ":8083", getenv, service.Builder(standard.Build))
	require.ErrorContains(t, err, executor.EnvConcurrency)
}
