package stack

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
)

func newRecorder(_ context.Context, d service.Deps, databaseURL string) (service.Component, http.Handler, error) {
	// TOOLWIRE_RECORDER_BATCH and TOOLWIRE_RECORDER_POLL apply in process
	// too; the database is the stack's.
	cfg, err := recorder.ConfigFromEnv(func(k string) string {
		if k == recorder.EnvDatabaseURL {
			return databaseURL
		}
		return d.Getenv(k)
	})
	if err != nil {
		return nil, nil, err
	}
	r, err := recorder.New(d, cfg) //nolint:contextcheck // New does no I/O: the pool connects in Start, under its context

	if err != nil {
		return nil, nil, err
	}
	return r, r.Handler(), nil
}
