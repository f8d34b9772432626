package stack

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/events/service"
	"github.com/toolwire/toolwire/services/recorder"
)

func newRecorder(_ context.Context, d service.Deps, databaseURL string) (service.Component, http.Handler, error) {
	r, err := recorder.New(d, recorder.Config{DatabaseURL: databaseURL}) //nolint:contextcheck // New does no I/O: the pool connects in Start, under its context

	if err != nil {
		return nil, nil, err
	}
	return r, r.Handler(), nil
}
