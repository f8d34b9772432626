package orchestrator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// A provider that keeps failing ends the run with a clear reason, after the
// adapter's retries.
func TestProviderThatKeepsFailingFailsTheRun(t *testing.T) {
	h := orchestratortest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	f := providertest.New(t, providertest.Reply{Status: 503, Headers: map[string]string{"Retry-After": "0"},
		Body: `{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}`})
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{
		openai.Name: openai.New(provider.Config{APIKey: "k", BaseURL: f.URL, MaxRetries: 2}),
	}})
	req := envelope.RunRequest{RunID: "failing-model", Tenant: envelope.Tenant{OrgID: "acme"},
		Agent:    envelope.Agent{Name: "agent", Model: envelope.Model{Provider: "openai", Name: "gpt-4o-mini"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}
	h.Submit(ctx, req)
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeProviderError, final.Code)
	require.Equal(t, "model call failed: openai model gpt-4o-mini failed after 3 attempts: OpenAI API error: 503 Service Unavailable: "+
		"The engine is currently overloaded, please try again later", final.Reason)
	require.Len(t, f.Requests(), 3)
}

// An unknown provider or a missing model name is refused at the start with a
// hint.
func TestRunRequestProviderRejections(t *testing.T) {
	h := orchestratortest.New(t)
	h.Start("o1", orchestrator.Config{})
	for _, tc := range []struct {
		model  envelope.Model
		reason string
	}{
		{envelope.Model{Provider: "openai", Name: "gpt-4o"}, `unknown model provider "openai"`},
		{envelope.Model{Provider: "openai", Name: "gpt-4o"}, "set OPENAI_API_KEY"},
		{envelope.Model{Provider: "anthropic", Name: "claude-haiku-4-5"}, "set ANTHROPIC_API_KEY"},
	} {
		id := fmt.Sprintf("rej-%s-%d", tc.model.Provider, len(tc.reason))
		final := h.Run(envelope.RunRequest{RunID: id, Tenant: envelope.Tenant{OrgID: "acme"},
			Agent:    envelope.Agent{Name: "agent", Model: tc.model},
			Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}, 30*time.Second)
		require.Equal(t, events.StatusFailed, final.Status)
		require.True(t, strings.Contains(final.Reason, tc.reason), final.Reason)
	}
}
