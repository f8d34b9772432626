package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// getReplay serves a run's replay bundle (envelope.ReplayBundle), as
// store.ReplayBundle assembles it, its outputs read from their blob when the
// completed event left them there.
func (a *api) getReplay(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	b, err := store.ReplayBundle(r.Context(), a.store, run.RunID, a.blobReader())
	if errors.Is(err, store.ErrNoRequest) {
		writeError(w, http.StatusConflict, apitypes.CodeNoRequest,
			fmt.Sprintf("run %q has no recorded request (yet): its replay bundle starts with it", run.RunID))
		return
	}
	if err != nil {
		a.blobError(w, r, run, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}
