// Command orchestrator runs toolwire's agent loop as its own process.
// Configuration comes from the environment: see the README.
package main

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator"
)

func main() {
	service.Main("orchestrator", ":8081", func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
		cfg, err := orchestrator.ConfigFromEnv(d.Getenv)
		if err != nil {
			return nil, nil, err
		}
		s, err := orchestrator.New(d, cfg)
		return s, nil, err
	})
}
