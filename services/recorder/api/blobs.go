package api

import (
	"errors"
	"net/http"
	"strings"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// blobsHandler serves GET /v1/blobs/{name}: the full payload of a truncated
// output, as its envelope's blob attachment names it (package blobs).
//
// A blob belongs to the run its name starts with (<run_id>.<call_id>.output,
// <run_id>.outputs: a run id holds no '.'), and is served only to a principal
// who sees that run; any other blob name to operators only. Otherwise the
// answer is the 404 of a blob that does not exist.
func (a *api) blobsHandler() http.HandlerFunc {
	var serve http.HandlerFunc
	if a.opts.JS == nil {
		serve = func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusServiceUnavailable, apitypes.CodeUnavailable, "this recorder serves no blobs: it has no JetStream")
		}
	} else {
		serve = blobs.Handler(a.opts.JS).ServeHTTP
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.seesBlob(w, r, r.PathValue("name")) {
			return
		}
		serve(w, r)
	}
}

// seesBlob reports whether the principal may read the blob name, writing
// the 404 (or the store's error) when not.
func (a *api) seesBlob(w http.ResponseWriter, r *http.Request, name string) bool {
	p := auth.FromContext(r.Context())
	if p.AllTenants() {
		return true
	}
	runID, _, ok := strings.Cut(name, ".")
	if ok && events.ValidateRunID(runID) == nil {
		run, err := a.store.Run(r.Context(), runID)
		if err == nil && p.Sees(run.Tenant) {
			return true
		}
		if err != nil && !errors.Is(err, store.ErrRunNotFound) {
			a.internal(w, r, err)
			return false
		}
	}
	http.Error(w, "no blob "+name, http.StatusNotFound) // as package blobs answers a missing one
	return false
}
