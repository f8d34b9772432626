package api_test

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestStreamEndsWhenTheTokenIsRevoked: a live stream checks its credentials
// at every heartbeat: revoking the token ends it, and reconnecting is refused.
func TestStreamEndsWhenTheTokenIsRevoked(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st := sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	fx := storetest.StartedRun(t, "stream-revoke", "weather", storetest.TenantA, time.Now())
	if err := st.Write(ctx, fx.Records(t)...); err != nil {
		t.Fatal(err)
	}
	tok, row, err := auth.NewToken(auth.TokenSpec{Name: "watcher", OrgID: storetest.TenantA.OrgID, Role: auth.RoleViewer}, time.Now())
	if err == nil {
		err = st.CreateToken(ctx, row)
	}
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{Required: true}, st, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer close(done)
	srv := httptest.NewServer(api.New(st, api.Options{Log: log, Auth: a, Heartbeat: 20 * time.Millisecond, Poll: 20 * time.Millisecond, Done: done}))
	defer srv.Close()

	open := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/runs/stream-revoke/events/stream", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := open()
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), ": keep-alive") {
			break // a heartbeat passed: the credentials were checked once
		}
	}
	if err := st.RevokeToken(ctx, row.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	n := 0
	for lines.Scan() { // until the server ends the stream (or ctx does)
		n++
	}
	if ctx.Err() != nil {
		t.Fatalf("the stream did not end after its token was revoked (%d lines more)", n)
	}
	again := open()
	_ = again.Body.Close()
	if again.StatusCode != http.StatusUnauthorized {
		t.Fatalf("reconnecting with the revoked token: %d", again.StatusCode)
	}
}
