package recorder_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/api/apitest"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestAuthMatrix: every route of the recorder's HTTP server (the API, its
// live stream, the blobs, the pages and the approval form) for every kind
// of caller: anonymous, a viewer of tenant A, a viewer of tenant B, an
// approver of A, and the admin (of every tenant), with authentication on.
// Tenant B never sees A's run, events, calls, turns, blobs, bundle or
// stream, even with their exact ids: each answers exactly as for a run that
// was never recorded.
func TestAuthMatrix(t *testing.T) {
	env := eventstest.Start(t)
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	const adminToken = "matrix-admin-token"
	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog(), Common: service.Common{HTTPAddr: ":8080"}},
		recorder.Config{DatabaseURL: db, AuthRequired: true, AdminToken: adminToken, StreamWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, rec)
	srv := httptest.NewServer(rec.Handler())
	t.Cleanup(srv.Close)

	// Tenant A's run and tenant B's, recorded through JetStream; a blob of
	// A's first call's output.
	now := time.Now()
	fxA := storetest.CompletedRun(t, "matrix-run-a", "weather", storetest.TenantA, now)
	fxB := storetest.CompletedRun(t, "matrix-run-b", "weather", storetest.TenantB, now)
	publishEvents(t, env.JS, fxA.Events...)
	publishEvents(t, env.JS, fxB.Events...)
	callA := fxA.Envelopes[0].CallID
	blobA := "matrix-run-a." + callA + ".output"
	if _, err := blobs.Put(testCtx(t), env.JS, blobA, []byte(`{"secret":"of tenant A"}`), "application/json"); err != nil {
		t.Fatal(err)
	}

	tokens, closeTokens, err := recorder.OpenTokens(testCtx(t), db, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer closeTokens()
	issue := func(spec auth.TokenSpec) string {
		tok, row, err := auth.NewToken(spec, time.Now())
		if err == nil {
			err = tokens.CreateToken(testCtx(t), row)
		}
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	callers := []struct{ name, token string }{
		{"anonymous", ""},
		{"viewer A", issue(auth.TokenSpec{Name: "viewer-a", OrgID: storetest.TenantA.OrgID, WorkspaceID: storetest.TenantA.WorkspaceID, Role: auth.RoleViewer})},
		{"viewer B", issue(auth.TokenSpec{Name: "viewer-b", OrgID: storetest.TenantB.OrgID, Role: auth.RoleViewer})},
		{"approver A", issue(auth.TokenSpec{Name: "approver-a", OrgID: storetest.TenantA.OrgID, Role: auth.RoleApprover})},
		{"admin", adminToken},
	}

	do := func(method, path, token string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
		defer cancel()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(url.Values{"decision": {"approve"}, "note": {"ok"}}.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer func() { _ = resp.Body.Close() }()
		var b []byte
		if strings.HasSuffix(path, "/events/stream") {
			b = make([]byte, 512) // the head of the stream is enough
			n, _ := io.ReadAtLeast(resp.Body, b, 1)
			b = b[:n]
		} else {
			b, _ = io.ReadAll(resp.Body)
		}
		if resp.Header.Get("Content-Type") == "application/json" {
			check, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
			apitest.CheckResponse(t, check, resp.StatusCode, resp.Header, b)
		}
		return resp.StatusCode, string(b)
	}
	eventually(t, "both runs recorded", func() (bool, string) {
		var last []string
		for _, id := range []string{"matrix-run-a", "matrix-run-b"} {
			for _, route := range []string{"/outputs", "/replay", "/envelopes"} {
				if s, body := do(http.MethodGet, "/v1/runs/"+id+route, adminToken); s != http.StatusOK {
					last = append(last, body)
				}
			}
		}
		return len(last) == 0, strings.Join(last, "; ")
	})

	// The routes of run A, each with the path of the same route for a run
	// that was never recorded (what B must get).
	runA := "/v1/runs/matrix-run-a"
	ofA := []string{
		runA, runA + "/outputs", runA + "/turns", runA + "/envelopes", runA + "/events", runA + "/events/stream",
		runA + "/replay", runA + "/pins", runA + "/calls/" + callA, runA + "/calls/" + callA + "/materialize",
		"/v1/blobs/" + blobA, "/runs/matrix-run-a", "/runs/matrix-run-a/timeline",
	}
	const (
		ok           = http.StatusOK
		unauthorized = http.StatusUnauthorized
		forbidden    = http.StatusForbidden
		notFound     = http.StatusNotFound
	)
	// want[caller] for each route; A's routes: A's callers and the admin
	// read them, B gets 404.
	type row struct {
		method, path string
		want         [5]int // anonymous, viewer A, viewer B, approver A, admin
	}
	var rows []row
	for _, p := range ofA {
		if strings.HasSuffix(p, "/events/stream") {
			// A stream may be opened before its run is recorded: B's waits
			// (and then ends with an error event) as for a run never
			// recorded.
			rows = append(rows, row{http.MethodGet, p, [5]int{unauthorized, ok, ok, ok, ok}})
			continue
		}
		rows = append(rows, row{http.MethodGet, p, [5]int{unauthorized, ok, notFound, ok, ok}})
	}
	rows = append(rows,
		row{http.MethodGet, "/v1/runs", [5]int{unauthorized, ok, ok, ok, ok}},
		row{http.MethodGet, "/v1/runs/matrix-run-b", [5]int{unauthorized, notFound, ok, notFound, ok}},
		row{http.MethodGet, "/v1/tools", [5]int{unauthorized, ok, ok, ok, ok}},
		row{http.MethodGet, "/v1/tools?org_id=" + storetest.TenantA.OrgID, [5]int{unauthorized, ok, notFound, ok, ok}},
		row{http.MethodGet, "/v1/admin/tools", [5]int{unauthorized, forbidden, forbidden, forbidden, ok}},
		// The admin routes' writes (the bodies are not valid: 400 for the
		// admin, whom the role check lets through).
		row{http.MethodPost, "/v1/admin/tools", [5]int{unauthorized, forbidden, forbidden, forbidden, http.StatusBadRequest}},
		row{http.MethodGet, "/v1/admin/tools/ghost@1.0.0", [5]int{unauthorized, forbidden, forbidden, forbidden, notFound}},
		row{http.MethodPut, "/v1/admin/tools/ghost@1.0.0/state", [5]int{unauthorized, forbidden, forbidden, forbidden, http.StatusBadRequest}},
		row{http.MethodPost, "/v1/admin/tools/ghost@1.0.0/publish", [5]int{unauthorized, forbidden, forbidden, forbidden, notFound}},
		row{http.MethodGet, "/v1/openapi.yaml", [5]int{ok, ok, ok, ok, ok}},
		row{http.MethodGet, "/", [5]int{unauthorized, ok, ok, ok, ok}},
		row{http.MethodGet, "/builder", [5]int{unauthorized, ok, ok, ok, ok}},
		row{http.MethodGet, "/login", [5]int{ok, ok, ok, ok, ok}},
		row{http.MethodGet, "/assets/app.css", [5]int{ok, ok, ok, ok, ok}},
		// The approval form: the call does not await approval (404 for
		// those who may decide), a viewer may not decide (403), B does not
		// see the run (404).
		row{http.MethodPost, "/runs/matrix-run-a/calls/" + callA + "/decision", [5]int{unauthorized, forbidden, notFound, notFound, notFound}},
	)
	for _, r := range rows {
		for i, c := range callers {
			status, body := do(r.method, r.path, c.token)
			if status != r.want[i] {
				t.Errorf("%s %s as %s: %d, want %d: %.300s", r.method, r.path, c.name, status, r.want[i], body)
				continue
			}
			if c.name == "viewer B" && strings.Contains(body, "matrix-run-a") && !strings.Contains(r.path, "matrix-run-a") {
				t.Errorf("%s %s as viewer B shows A's run: %.300s", r.method, r.path, body)
			}
		}
	}

	// A viewer of another workspace of A's org does not see A's run either.
	otherWS := issue(auth.TokenSpec{Name: "viewer-a-ws9", OrgID: storetest.TenantA.OrgID, WorkspaceID: "ws-9", Role: auth.RoleViewer})
	for _, p := range ofA {
		want := notFound
		if strings.HasSuffix(p, "/events/stream") {
			want = ok // it waits, as for a run never recorded
		}
		if status, body := do(http.MethodGet, p, otherWS); status != want {
			t.Errorf("GET %s as a viewer of %s/ws-9: %d, want 404: %.300s", p, storetest.TenantA.OrgID, status, body)
		}
	}

	// B on A's routes answers exactly as on a run never recorded.
	bTok := callers[2].token
	for _, p := range ofA {
		ghost := strings.ReplaceAll(p, "matrix-run-a", "matrix-run-z")
		sA, bodyA := do(http.MethodGet, p, bTok)
		sZ, bodyZ := do(http.MethodGet, ghost, bTok)
		if sA != sZ || strings.ReplaceAll(bodyA, "matrix-run-a", "matrix-run-z") != bodyZ {
			t.Errorf("B on %s: %d %q; on a run never recorded: %d %q", p, sA, bodyA, sZ, bodyZ)
		}
		if strings.Contains(bodyA, callA) && !strings.Contains(p, callA) {
			t.Errorf("B on %s learns A's call id", p)
		}
	}

	// The lists: each tenant sees its own runs, whatever it filters on.
	for _, tc := range []struct {
		caller, query, want string
	}{
		{"viewer A", "", "matrix-run-a"}, {"viewer B", "", "matrix-run-b"},
		{"viewer B", "?org_id=" + storetest.TenantA.OrgID, ""},
		{"viewer B", "?tenant=" + storetest.TenantA.OrgID + "/" + storetest.TenantA.WorkspaceID, ""},
		{"approver A", "?org_id=" + storetest.TenantB.OrgID, ""}, {"admin", "?org_id=" + storetest.TenantB.OrgID, "matrix-run-b"},
	} {
		var token string
		for _, c := range callers {
			if c.name == tc.caller {
				token = c.token
			}
		}
		_, body := do(http.MethodGet, "/v1/runs"+tc.query, token)
		var list apitypes.RunListJSON
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var ids []string
		for _, r := range list.Runs {
			ids = append(ids, r.RunID)
		}
		if got := strings.Join(ids, ","); got != tc.want {
			t.Errorf("GET /v1/runs%s as %s: %q, want %q", tc.query, tc.caller, got, tc.want)
		}
		_, page := do(http.MethodGet, "/"+tc.query, token)
		for _, id := range []string{"matrix-run-a", "matrix-run-b"} {
			if strings.Contains(page, `href="/runs/`+id+`"`) != (id == tc.want) {
				t.Errorf("runs page%s as %s: shows %s: %t", tc.query, tc.caller, id, !(id == tc.want))
			}
		}
	}

	// Credentials that are not valid: 401, with the way to authenticate.
	for _, bad := range []string{"tw_0123456789abcdef_" + strings.Repeat("A", 43), "nonsense", adminToken + "x"} {
		status, body := do(http.MethodGet, "/v1/runs", bad)
		if status != unauthorized || !strings.Contains(body, `"code":"unauthorized"`) {
			t.Errorf("bad token %q: %d %s", bad, status, body)
		}
	}
}
