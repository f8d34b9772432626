package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// SettledHeader, on a replay bundle, says whether the run had settled
// (store.Settled) when the bundle was read: "false" for a run still going, or
// one that ended with calls whose envelopes had not come within store.SettleWait.
const SettledHeader = "Toolwire-Run-Settled"

// settlePoll is how often a replay bundle's read looks whether its run has
// settled.
const settlePoll = 25 * time.Millisecond

// getReplay serves a run's replay bundle (envelope.ReplayBundle), as
// store.ReplayBundle assembles it, its outputs read from their blob when the
// completed event left them there.
func (a *api) getReplay(w http.ResponseWriter, r *http.Request) {
	run, ok := a.run(w, r)
	if !ok {
		return
	}
	// A run recorded as ended may still have envelopes on their way (its calls
	// are recorded by another consumer): the bundle waits for them, within
	// store.SettleWait, and says in SettledHeader whether it holds them all.
	_, settled, err := store.AwaitSettled(r.Context(), a.store, run.RunID, store.SettleWait, settlePoll)
	if err == nil {
		var b envelope.ReplayBundle
		b, err = store.ReplayBundle(r.Context(), a.store, run.RunID, a.blobReader())
		if err == nil {
			w.Header().Set(SettledHeader, strconv.FormatBool(settled))
			writeJSON(w, http.StatusOK, b)
			return
		}
	}
	if errors.Is(err, store.ErrRunNotFound) { // deleted meanwhile (retention)
		notFoundRun(w, run.RunID)
		return
	}
	if errors.Is(err, store.ErrNoRequest) {
		writeError(w, http.StatusConflict, apitypes.CodeNoRequest,
			fmt.Sprintf("run %q has no recorded request (yet): its replay bundle starts with it", run.RunID))
		return
	}
	a.blobError(w, r, run, err)
}
