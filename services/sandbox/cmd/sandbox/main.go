// Command sandbox runs toolwire's sandbox service as its own process.
package main

import (
	"context"
	"net/http"

	"github.com/toolwire/toolwire/pkg/events/service"
	"github.com/toolwire/toolwire/services/sandbox"
)

func main() {
	service.Main("sandbox", ":8084", func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
		d.Log.Warn("no sandbox runtime is implemented yet: this service consumes no jobs")
		return sandbox.New(), nil, nil
	})
}
