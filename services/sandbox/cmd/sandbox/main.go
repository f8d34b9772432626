// Command sandbox runs toolwire's sandbox service as its own process: it runs
// the code of sandbox jobs in gVisor (runsc) or bubblewrap, configured by the
// TOOLWIRE_SANDBOX_* environment (see the README's "Sandbox" section).
package main

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/sandbox"
)

func main() {
	service.Main("sandbox", ":8084", build)
}

func build(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
	cfg, err := sandbox.ConfigFromEnv(d.Getenv)
	if err != nil {
		return nil, nil, err
	}
	s, err := sandbox.New(d, cfg)
	if err != nil {
		return nil, nil, err
	}
	return s, nil, nil
}
