package worker

import (
	"errors"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// ToolError is an error the model sees with its code and message (and
// details): return one, wrapped or not, from a tool's function.
type ToolError = envelope.ToolError

// Code is a ToolError's code, from the stable taxonomy.
type Code = envelope.ErrorCode

// The error codes a tool may return.
const (
	CodeValidation    = envelope.CodeValidation    // the input makes no sense, whatever its schema says
	CodeTimeout       = envelope.CodeTimeout       // something the tool waited for took too long
	CodeRateLimit     = envelope.CodeRateLimit     // an upstream limit was reached (set RetryAfterS)
	CodePolicyDenied  = envelope.CodePolicyDenied  // the tool refuses this call
	CodeAuthRequired  = envelope.CodeAuthRequired  // a credential is missing or refused
	CodeProviderError = envelope.CodeProviderError // the service behind the tool failed
	CodeNetworkError  = envelope.CodeNetworkError  // it could not be reached
	CodeSandboxError  = envelope.CodeSandboxError  // a sandbox failed or a limit was hit
	CodeUnknown       = envelope.CodeUnknown       // anything else
)

// Errorf returns a *ToolError with code and a formatted message: what the
// model reads, so say what went wrong and what to do instead.
func Errorf(code Code, format string, args ...any) *ToolError {
	return envelope.NewToolError(code, format, args...)
}

var (
	// ErrInvalidTool: a tool's declaration breaks the rules of a tool
	// definition (the message says which).
	ErrInvalidTool = envelope.ErrInvalidTool
	// ErrConflict: the registry holds the tool's version with another
	// definition. Publish the change as a new version.
	ErrConflict = registry.ErrConflict
	// errDefaultQueue: a worker tool on the executor binary's queue.
	errDefaultQueue = errors.New(`queue "default" is the executor binary's, whose replicas do not have your function: name a queue of your own`)
)
