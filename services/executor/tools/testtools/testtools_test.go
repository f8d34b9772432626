package testtools

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/toolapi/tooltest"
)

func TestDefinitions(t *testing.T) {
	names := map[string]bool{}
	for _, tl := range Tools() {
		def := tl.Definition()
		names[def.Name] = true
		tooltest.CheckBuiltinDefinition(t, def)
		require.Equal(t, envelope.CategoryUtility, def.Metadata.Category)
		require.Equal(t, envelope.SideEffectsNone, def.Metadata.SideEffects)
		require.Equal(t, envelope.CacheNone, def.Metadata.Cache)
	}
	require.Equal(t, map[string]bool{"failing": true, "sleep": true}, names)
	require.Equal(t, 120000, Sleep().Definition().TimeoutMS)
}

func TestFailing(t *testing.T) {
	tooltest.RunCases(t, Failing(), []tooltest.Case{
		{Name: "message", Input: `{"message":"upstream returned 503"}`, WantCode: envelope.CodeProviderError, WantMsg: "upstream returned 503"},
		{Name: "default message", Input: `{}`, WantCode: envelope.CodeProviderError, WantMsg: DefaultFailingMessage},
		{Name: "message too long", Input: `{"message":"` + strings.Repeat("x", 1025) + `"}`, WantInvalid: []string{"maxLength"}},
		{Name: "extra property", Input: `{"code":"TIMEOUT"}`, WantInvalid: []string{"additional properties 'code' not allowed"}},
	})
}

func TestSleep(t *testing.T) {
	tooltest.RunCases(t, Sleep(), []tooltest.Case{
		{Name: "zero", Input: `{"ms":0}`, WantOut: `{"slept_ms":0}`},
		{Name: "one", Input: `{"ms":1}`, WantOut: `{"slept_ms":1}`},
		{Name: "missing ms", Input: `{}`, WantInvalid: []string{"missing property 'ms'"}},
		{Name: "negative", Input: `{"ms":-1}`, WantInvalid: []string{"at /ms", "minimum"}},
		{Name: "too long", Input: `{"ms":600001}`, WantInvalid: []string{"at /ms", "maximum"}},
		{Name: "fraction", Input: `{"ms":1.5}`, WantInvalid: []string{"at /ms", "want integer"}},
	})

	t.Run("honours cancellation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := Sleep().Execute(ctx, json.RawMessage(`{"ms":600000}`), toolapi.Context{})
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("reports the cause of its deadline", func(t *testing.T) {
		errToolTimeout := errors.New("tool timeout") // the executor's cause
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Millisecond, errToolTimeout)
		defer cancel()
		_, err := Sleep().Execute(ctx, json.RawMessage(`{"ms":600000}`), toolapi.Context{})
		require.ErrorIs(t, err, errToolTimeout)
	})
}
