package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker/dlqtools"
)

// TestDLQServe: `toolwire dlq serve`, run from the folder of a dev whose
// identities include the ops worker, finds both seeds by itself and serves
// the dead-letter tools to an agent run; asked with one seed only, it
// refuses at once; interrupted, it drains and returns.
func TestDLQServe(t *testing.T) {
	for _, k := range []string{service.EnvNATSSeedFile, service.EnvNATSCreds, service.EnvNATSInbox, EnvOperationsSeedFile} {
		t.Setenv(k, "")
	}
	home := t.TempDir()
	data := filepath.Join(home, devDataDir)
	keys, err := identity.LoadOrCreate(stack.IdentitiesDir(data))
	require.NoError(t, err)
	require.NoError(t, keys.AddWorker(identity.Worker{Queues: []string{dlqtools.Queue}}))
	st, err := stack.Start(t.Context(), stack.Options{DataDir: data, Identities: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	t.Chdir(home)

	_, _, err = runCLI(t, "", "dlq", "serve", "--nats", st.URL, "--operations-seed", "")
	require.ErrorContains(t, err, "give both seeds")

	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		root := newRootCmd()
		root.SetArgs([]string{"dlq", "serve", "--nats", st.URL})
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		done <- root.ExecuteContext(ctx)
	}()
	servicetest.PollUntil(t, 30*time.Second, "the dead-letter tools are registered", func() bool {
		out, _, err := runCLI(t, "", "tools", "list", "--nats", st.URL)
		require.NoError(t, err)
		return regexp.MustCompile(`list_dlq_events@1\.0\.0.*healthy`).MatchString(out)
	})

	req := orchestratortest.Scripted(t, "run-ops", []string{"list_dlq_events@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("list_dlq_events", map[string]any{})}},
		map[string]any{"content": "nothing dead"},
	)
	final := runCompleted(t, st, req)
	env := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.Nil(t, env.Error, "%+v", env.Error)
	var out dlqtools.ListOut
	require.NoError(t, json.Unmarshal(env.Output, &out))
	require.Empty(t, out.DeadLetters)

	stop()
	select {
	case err := <-done:
		require.True(t, err == nil || errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("dlq serve did not return within 30s of its interruption")
	}
}
