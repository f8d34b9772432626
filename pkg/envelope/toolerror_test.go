package envelope_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestErrorCodes(t *testing.T) {
	codes := envelope.ErrorCodes()
	require.Equal(t, []envelope.ErrorCode{
		"VALIDATION_ERROR", "TIMEOUT", "RATE_LIMIT", "POLICY_DENIED", "AUTH_REQUIRED",
		"PROVIDER_ERROR", "NETWORK_ERROR", "SANDBOX_ERROR", "UNKNOWN",
	}, codes)
	for _, c := range codes {
		require.True(t, c.Valid(), c)
	}
	for _, c := range []envelope.ErrorCode{"", "timeout", "OK", "VALIDATION"} {
		require.False(t, c.Valid(), c)
	}
	codes[0] = "MUTATED"
	require.Equal(t, envelope.CodeValidation, envelope.ErrorCodes()[0], "callers get a fresh slice")
}

func TestToolErrorIsAs(t *testing.T) {
	timeout := envelope.NewToolError(envelope.CodeTimeout, "no answer within %d ms", 500)
	require.Equal(t, "no answer within 500 ms", timeout.Message)
	require.Equal(t, "TIMEOUT: no answer within 500 ms", timeout.Error())

	wrapped := fmt.Errorf("executor: %w", fmt.Errorf("http tool: %w", timeout))
	joined := errors.Join(errors.New("other"), timeout)

	tests := []struct {
		name   string
		err    error
		target error
		is     bool
	}{
		{"same code", timeout, &envelope.ToolError{Code: envelope.CodeTimeout}, true},
		{"wrapped twice", wrapped, &envelope.ToolError{Code: envelope.CodeTimeout}, true},
		{"joined", joined, &envelope.ToolError{Code: envelope.CodeTimeout}, true},
		{"same code and message", wrapped, &envelope.ToolError{Code: envelope.CodeTimeout, Message: "no answer within 500 ms"}, true},
		{"other message", wrapped, &envelope.ToolError{Code: envelope.CodeTimeout, Message: "other"}, false},
		{"other code", wrapped, &envelope.ToolError{Code: envelope.CodeRateLimit}, false},
		{"target wrapped", timeout, fmt.Errorf("x: %w", &envelope.ToolError{Code: envelope.CodeTimeout}), true},
		{"plain target", wrapped, errors.New("TIMEOUT: no answer within 500 ms"), false},
		{"sentinel target", wrapped, envelope.ErrInvalidJSON, false},
		{"plain error", errors.New("boom"), &envelope.ToolError{Code: envelope.CodeUnknown}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.is, errors.Is(tc.err, tc.target))
		})
	}

	var te *envelope.ToolError
	require.ErrorAs(t, wrapped, &te)
	require.Same(t, timeout, te)
}

func TestAsToolError(t *testing.T) {
	rl := envelope.NewToolError(envelope.CodeRateLimit, "slow down")
	tests := []struct {
		name string
		err  error
		code envelope.ErrorCode
		msg  string
		same bool
	}{
		{"tool error", rl, envelope.CodeRateLimit, "slow down", true},
		{"wrapped", fmt.Errorf("call 3: %w", rl), envelope.CodeRateLimit, "slow down", true},
		{"plain error is UNKNOWN", errors.New("nil pointer"), envelope.CodeUnknown, "nil pointer", false},
		{"wrapped plain error", fmt.Errorf("tool: %w", errors.New("eof")), envelope.CodeUnknown, "tool: eof", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			te := envelope.AsToolError(tc.err)
			require.NotNil(t, te)
			require.Equal(t, tc.code, te.Code)
			require.Equal(t, tc.msg, te.Message)
			if tc.same {
				require.Same(t, rl, te)
			}
		})
	}
	require.Nil(t, envelope.AsToolError(nil))
}

func TestToolErrorJSON(t *testing.T) {
	s := newSchemas(t)
	tests := []struct {
		name string
		err  *envelope.ToolError
		want string
	}{
		{"bare", envelope.NewToolError(envelope.CodeAuthRequired, "missing secret OPENAI_KEY"), `{"code":"AUTH_REQUIRED","message":"missing secret OPENAI_KEY"}`},
		{"details", envelope.NewToolError(envelope.CodeValidation, "bad input").WithDetails([]string{"at /q: missing"}), `{"code":"VALIDATION_ERROR","message":"bad input","details":["at /q: missing"]}`},
		{"retry", &envelope.ToolError{Code: envelope.CodeRateLimit, Message: "later", RetryAfterS: 1.5}, `{"code":"RATE_LIMIT","message":"later","retry_after_s":1.5}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.err)
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(b))
			require.NoError(t, s.Validate(envelope.SchemaToolError, b))

			var back envelope.ToolError
			require.NoError(t, json.Unmarshal(b, &back))
			require.Equal(t, tc.err.Code, back.Code)
			require.Equal(t, tc.err.Message, back.Message)
			require.Equal(t, tc.err.RetryAfterS, back.RetryAfterS)
		})
	}
}
