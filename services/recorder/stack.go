package recorder

import (
	"fmt"

	"github.com/toolwire/toolwire/pkg/service"
)

// ForStack is the recorder on databaseURL (a Postgres URL, or sqlite:<path>
// for the embedded SQLite store) for package stack's Options.Recorder: what
// `toolwire dev` runs beside the pipeline.
func ForStack(databaseURL string) StackRecorder { return StackRecorder{DatabaseURL: databaseURL} }

// StackRecorder builds the recorder as its binary does (Build: the
// environment's TOOLWIRE_* settings apply), on its own database.
type StackRecorder struct {
	DatabaseURL string
}

// Check refuses to serve listen beyond loopback without authentication (or
// the loud opt-out), as the binary does, before anything starts.
func (r StackRecorder) Check(listen string, getenv func(string) string) error {
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("stack: recorder configuration: %w", err)
	}
	return CheckExposure(listen, cfg)
}

// Build builds the recorder from d, on r's database.
func (r StackRecorder) Build(d service.Deps) (service.HTTPComponent, error) {
	rec, err := Build(d, func(c *Config) { c.DatabaseURL = r.DatabaseURL })
	if err != nil {
		return nil, err
	}
	return rec, nil
}
