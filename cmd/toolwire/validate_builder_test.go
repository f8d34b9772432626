package main

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
)

// TestValidateAcceptsTheBuildersRequest: the run request the recorder's
// agent builder shows is a document `toolwire validate` reads, and what the
// page says of it is, line for line, what validate prints: for a clean
// configuration, for warnings (deprecated, above the ceiling, a missing
// scope, a queue nobody serves) and for errors (a blocked tool).
func TestValidateAcceptsTheBuildersRequest(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	reg, err := registry.Open(ctx, env.JS)
	require.NoError(t, err)
	def := func(name string, se envelope.SideEffects, scopes ...string) envelope.ToolDefinition {
		return envelope.ToolDefinition{Name: name, Version: "1.0.0", Description: name, InputSchema: []byte(`{"type":"object"}`),
			Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: se, Cache: envelope.CacheNone},
			Implementation: envelope.Implementation{Kind: envelope.ImplHTTP, Config: []byte(`{"url":"https://api.example/` + name + `"}`)},
			RequiredScopes: scopes}
	}
	upper := def("upper", envelope.SideEffectsNone)
	upper.Queue = "text"
	for _, e := range []registry.Entry{
		{Definition: def("search", envelope.SideEffectsReads)},
		{Definition: def("old_search", envelope.SideEffectsReads), State: registry.StateDeprecated},
		{Definition: def("send_email", envelope.SideEffectsWrites, "email:send")},
		{Definition: upper},
		{Definition: def("rm_rf", envelope.SideEffectsWrites), State: registry.StateBlocked},
	} {
		require.NoError(t, reg.Put(ctx, e))
	}
	require.NoError(t, registry.Beat(ctx, env.JS, registry.Worker{Queue: envelope.DefaultQueue, Instance: "w1", ID: "executor-1", TTL: registry.MaxWorkerTTL}, time.Now()))

	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: discardLogger()},
		recorder.Config{DatabaseURL: sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))})
	require.NoError(t, err)
	startCtx, endStart := context.WithCancel(ctx)
	require.NoError(t, rec.Start(startCtx))
	endStart()
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, rec.Stop(stopCtx))
	})
	srv := httptest.NewServer(rec.Handler())
	t.Cleanup(srv.Close)

	requestRE := regexp.MustCompile(`(?s)<pre id="request-json"[^>]*>(.*?)</pre>`)
	findingRE := regexp.MustCompile(`<p class="notice (?:bad finding-error|warn finding-warning|ok)"[^>]*>([^<]*)</p>`)
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		form  url.Values
		fails bool
	}{
		{name: "clean", form: url.Values{"tool": {"search@1.0.0"}}},
		{name: "warnings", form: url.Values{"tool": {"search@1.0.0", "old_search@1.0.0", "send_email@1.0.0", "upper@1.0.0"}, "side_effects": {"reads"}}},
		{name: "scopes granted", form: url.Values{"tool": {"send_email@1.0.0"}, "scopes": {"email:send"}}},
		{name: "blocked and unknown", form: url.Values{"tool": {"search@1.0.0", "rm_rf@1.0.0", "ghost@2.0.0"}}, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := url.Values{"name": {"researcher"}, "run_id": {"builder-" + strings.ReplaceAll(tc.name, " ", "-")},
				"provider": {"scripted"}, "model": {"m"}, "message": {"hi"}, "org_id": {"org1"}}
			for k, v := range tc.form {
				q[k] = v
			}
			resp, err := http.Get(srv.URL + "/builder?" + q.Encode())
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, resp.Body.Close())
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			m := requestRE.FindSubmatch(body)
			require.NotNil(t, m, "%s", body)
			file := filepath.Join(dir, tc.name+".json")
			require.NoError(t, os.WriteFile(file, []byte(html.UnescapeString(string(m[1]))), 0o600))
			var page []string
			for _, f := range findingRE.FindAllSubmatch(body, -1) {
				page = append(page, html.UnescapeString(string(f[1])))
			}

			out, err := cli(t, env.URL, "", "validate", file)
			if tc.fails {
				require.ErrorIs(t, err, errFindings)
			} else {
				require.NoError(t, err)
			}
			// The page lists errors first; validate prints warnings first.
			printed := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			require.ElementsMatch(t, printed, page, "validate:\n%s", out)
			require.NotEmpty(t, page)
		})
	}
}
