package api_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestStalePinScopedToTheTenant: a stale_last_success pin is served from
// the last success of the same agent node in the run's own tenant, whole:
// never from a run of another workspace (or another user) of the org, even
// a newer one, and so never outputs its reader may not see. A workspace-bound
// reader and an org-wide one get the same answer: the pin's value belongs to
// the run, not to who reads it.
func TestStalePinScopedToTheTenant(t *testing.T) {
	ctx := t.Context()
	st := sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	pins := []envelope.PinnedHandle{{Name: "search", Selector: envelope.PinSelector{Tool: "web_search"}, OnMissing: envelope.MissingStaleLastSuccess}}
	eu := envelope.Tenant{OrgID: "acme", WorkspaceID: "eu"}
	us := envelope.Tenant{OrgID: "acme", WorkspaceID: "us"}
	euAnn := envelope.Tenant{OrgID: "acme", WorkspaceID: "eu", UserID: "ann"}
	euBob := envelope.Tenant{OrgID: "acme", WorkspaceID: "eu", UserID: "bob"}
	fixtures := []*storetest.Run{
		// eu's node has no earlier success; us's, newer, has one.
		storetest.CompletedRunPinned(t, "us-ok", "weather", us, base.Add(time.Minute), pins),
		storetest.AnsweredRun(t, "eu-now", "weather", eu, base.Add(2*time.Minute), pins),
		// ann's node succeeded long ago, bob's since.
		storetest.CompletedRunPinned(t, "ann-ok", "travel", euAnn, base, pins),
		storetest.CompletedRunPinned(t, "bob-ok", "travel", euBob, base.Add(time.Minute), pins),
		storetest.AnsweredRun(t, "ann-now", "travel", euAnn, base.Add(2*time.Minute), pins),
		// A workspace-less run of the org does not feed a workspace's node.
		storetest.CompletedRunPinned(t, "org-ok", "maps", envelope.Tenant{OrgID: "acme"}, base, pins),
		storetest.AnsweredRun(t, "eu-maps", "maps", eu, base.Add(time.Minute), pins),
	}
	for _, fx := range fixtures {
		if err := st.Write(ctx, fx.Records(t)...); err != nil {
			t.Fatal(err)
		}
	}
	token := func(name, ws string) string {
		tok, row, err := auth.NewToken(auth.TokenSpec{Name: name, OrgID: "acme", WorkspaceID: ws, Role: auth.RoleViewer}, time.Now())
		if err == nil {
			err = st.CreateToken(ctx, row)
		}
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	euReader, orgReader := token("eu-reader", "eu"), token("org-reader", "")
	a, err := auth.New(auth.Config{Required: true}, st, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(st, api.Options{Log: log, Auth: a}))
	t.Cleanup(srv.Close)
	pinOf := func(tok, runID string) apitypes.PinJSON {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/runs/"+runID+"/pins", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var p apitypes.PinsJSON
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&p) != nil || len(p.Pins) != 1 {
			t.Fatalf("pins of %s: %d %+v", runID, resp.StatusCode, p)
		}
		return p.Pins[0]
	}
	for _, tc := range []struct {
		run, from string // from: "" for missing
	}{
		{"eu-now", ""},        // not us-ok: another workspace
		{"ann-now", "ann-ok"}, // not bob-ok, newer: another user
		{"eu-maps", ""},       // not org-ok: a run without a workspace
	} {
		for reader, tok := range map[string]string{"eu reader": euReader, "org reader": orgReader} {
			p := pinOf(tok, tc.run)
			switch {
			case tc.from == "" && (p.Source != apitypes.PinMissing || p.Value != nil || p.FromRunID != ""):
				t.Errorf("%s, pin of %s = %+v (from %q); want missing", reader, tc.run, p, p.FromRunID)
			case tc.from != "" && (p.Source != apitypes.PinFromStale || p.FromRunID != tc.from || p.Value == nil):
				t.Errorf("%s, pin of %s = %+v (from %q); want stale from %s", reader, tc.run, p, p.FromRunID, tc.from)
			}
		}
	}
}
