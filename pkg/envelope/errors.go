package envelope

import "errors"

// Sentinel errors of the contracts. Validation functions wrap them with details,
// so callers test with errors.Is.
var (
	ErrInvalidJSON    = errors.New("invalid JSON")
	ErrMissingTenant  = errors.New("missing tenant")
	ErrInvalidToolRef = errors.New("invalid tool reference")
	ErrInvalidRequest = errors.New("invalid run request")
	ErrInvalidTool    = errors.New("invalid tool definition")
	ErrPinMissing     = errors.New("pinned handle has no matching tool call")
	ErrInvalidPin     = errors.New("invalid pinned handle")
)
