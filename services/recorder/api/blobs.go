package api

import (
	"net/http"

	"github.com/toolwire/toolwire/pkg/events/blobs"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
)

// blobsHandler serves GET /v1/blobs/{name}: the full payload of a truncated
// output, as its envelope's blob attachment names it (package blobs).
func (a *api) blobsHandler() http.HandlerFunc {
	if a.opts.JS == nil {
		return func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable, "this recorder serves no blobs: it has no JetStream")
		}
	}
	return blobs.Handler(a.opts.JS).ServeHTTP
}
