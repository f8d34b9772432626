package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

func cachedBenchTool() testTool {
	tt := newTestTool("cached", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"ok":true,"rows":[1,2,3,4,5,6,7,8]}`), nil
	})
	tt.def.Metadata.Cache = envelope.CacheForever
	return tt
}

// BenchmarkCacheHit measures the executor's pipeline for a call served from
// the cache: registry lookup, input validation, cache key, KV get, the hit's
// envelope (no tool run).
func BenchmarkCacheHit(b *testing.B) {
	env := eventstest.Start(b)
	s := startExecutor(b, env, Config{}, WithTools(cachedBenchTool()))
	req := callRequest(b, "run-bench-cache", 1, "cached", "1.0.0", `{"city":"Lyon","fields":["population","area"]}`)
	log := slog.New(slog.DiscardHandler)
	entry, found, err := s.lookup(b.Context(), req.Ref())
	if err != nil || !found {
		b.Fatalf("lookup: %v (found %v)", err, found)
	}
	res, err := s.execute(b.Context(), &req, &entry, s.now().UTC(), 1, "", log)
	if err != nil || res.env.Error != nil || res.env.Cached {
		b.Fatalf("warm-up: %v %+v cached=%v", err, res.env.Error, res.env.Cached)
	}
	for b.Loop() {
		res, err := s.execute(b.Context(), &req, &entry, s.now().UTC(), 1, "", log)
		if err != nil || !res.env.Cached {
			b.Fatalf("not a hit: %v %+v", err, res.env.Error)
		}
	}
}

// BenchmarkCacheHitRoundTrip measures a cached call end to end: the approved
// event in, the completed event (cached: true) stored.
func BenchmarkCacheHitRoundTrip(b *testing.B) {
	env := eventstest.Start(b)
	startExecutor(b, env, Config{}, WithTools(cachedBenchTool()))
	pub := publish.NewPublisher(env.JS)
	const runID = "run-bench-cache-rt"
	w := watchRun(b, env.JS, runID)
	seq := 1
	publishApproved(b, pub, callRequest(b, runID, seq, "cached", "1.0.0", `{"q":"x"}`))
	w.wait(b, completedSubject(b, callRequest(b, runID, seq, "cached", "1.0.0", `{"q":"x"}`)))
	for b.Loop() {
		seq++ // another call id, the same cache key
		req := callRequest(b, runID, seq, "cached", "1.0.0", `{"q":"x"}`)
		publishApproved(b, pub, req)
		w.wait(b, completedSubject(b, req))
	}
}
