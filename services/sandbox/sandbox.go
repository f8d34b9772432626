// Package sandbox will run untrusted code for code tools in real isolation
// (bubblewrap and gVisor runsc), consuming sandbox jobs from
// toolwire.sandbox.<run_id>.<call_id>.requested and answering on .completed.
//
// The runtimes are not built yet: the service starts, serves its probes and
// metrics, and consumes nothing, so that no job is taken and lost. The
// executor does not route any tool here until the runtimes exist.
package sandbox

import "context"

// Service is the sandbox service.
type Service struct{}

// New returns the sandbox service.
func New() *Service { return &Service{} }

// Start implements the service lifecycle; there is nothing to start yet.
func (s *Service) Start(context.Context) error { return nil }

// Stop implements the service lifecycle.
func (s *Service) Stop(context.Context) error { return nil }
