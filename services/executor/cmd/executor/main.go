// Command executor runs toolwire's Tool Executor service.
package main

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
)

func main() {
	service.Main("executor", ":8083", build)
}

func build(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
	cfg, err := executor.ConfigFromEnv(d.Getenv)
	if err != nil {
		return nil, nil, err
	}
	s, err := executor.New(d, cfg)
	if err != nil {
		return nil, nil, err
	}
	return s, nil, nil
}
