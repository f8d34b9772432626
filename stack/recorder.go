package stack

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
)

// newRecorder builds the recorder as its binary does (recorder.Build: the
// TOOLWIRE_RECORDER_* and TOOLWIRE_ADMIN_TOKEN variables apply in process
// too), on the stack's database.
func newRecorder(_ context.Context, d service.Deps, databaseURL string) (service.Component, http.Handler, error) {
	r, err := recorder.Build(d, func(c *recorder.Config) { c.DatabaseURL = databaseURL })
	if err != nil {
		return nil, nil, err
	}
	return r, r.Handler(), nil
}
