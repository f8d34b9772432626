package envelope

import (
	"errors"
	"fmt"
)

// ErrorCode is the stable, machine-readable code of a ToolError. Downstream nodes
// may branch on it; the set is closed and never changes meaning.
type ErrorCode string

// The nine codes of the error taxonomy (docs/architecture.md, Contracts:
// ToolError).
const (
	CodeValidation    ErrorCode = "VALIDATION_ERROR" // input failed the tool's JSON Schema
	CodeTimeout       ErrorCode = "TIMEOUT"          // execution exceeded the tool's timeout
	CodeRateLimit     ErrorCode = "RATE_LIMIT"       // tool-specific rate limit exceeded
	CodePolicyDenied  ErrorCode = "POLICY_DENIED"    // the Policy Guard blocked the call
	CodeAuthRequired  ErrorCode = "AUTH_REQUIRED"    // missing or invalid secrets
	CodeProviderError ErrorCode = "PROVIDER_ERROR"   // the underlying API failed (5xx)
	CodeNetworkError  ErrorCode = "NETWORK_ERROR"    // DNS or connection failure
	CodeSandboxError  ErrorCode = "SANDBOX_ERROR"    // the sandbox failed or a limit was hit
	CodeUnknown       ErrorCode = "UNKNOWN"          // unhandled failure
)

// ErrorCodes lists every code in a stable order.
func ErrorCodes() []ErrorCode {
	return []ErrorCode{
		CodeValidation, CodeTimeout, CodeRateLimit, CodePolicyDenied, CodeAuthRequired,
		CodeProviderError, CodeNetworkError, CodeSandboxError, CodeUnknown,
	}
}

// Valid reports whether c is one of the nine codes.
func (c ErrorCode) Valid() bool {
	for _, k := range ErrorCodes() {
		if c == k {
			return true
		}
	}
	return false
}

// ToolError is the structured error of a failed tool call (docs/architecture.md,
// Contracts). It is data, not an exception: it goes back to the model as the
// tool's result.
//
// ToolError implements error, so tool implementations can return one and keep
// its code; errors.As finds it through any wrapping.
type ToolError struct {
	Code        ErrorCode `json:"code"`
	Message     string    `json:"message"`
	Details     any       `json:"details,omitempty"`
	RetryAfterS float64   `json:"retry_after_s,omitempty"`
}

// NewToolError returns a ToolError with the given code and formatted message.
func NewToolError(code ErrorCode, format string, args ...any) *ToolError {
	return &ToolError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *ToolError) Error() string { return string(e.Code) + ": " + e.Message }

// Is makes errors.Is(err, &ToolError{Code: X}) match any ToolError with code X.
func (e *ToolError) Is(target error) bool {
	var t *ToolError
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// WithDetails returns e with details set.
func (e *ToolError) WithDetails(d any) *ToolError { e.Details = d; return e }

// AsToolError returns the ToolError in err's chain, or wraps err as UNKNOWN.
func AsToolError(err error) *ToolError {
	if err == nil {
		return nil
	}
	var te *ToolError
	if errors.As(err, &te) {
		return te
	}
	return &ToolError{Code: CodeUnknown, Message: err.Error()}
}
