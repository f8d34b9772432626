package recorder

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestRetentionWatchWarnsBeforeEventsAreLost: with a backlog whose oldest
// event has used 75% of the stream's max age, the watch reports 0.75 and
// warns, naming the variable to raise; the bytes limit likewise; once the
// backlog is recorded, both read 0 and nothing is said.
func TestRetentionWatchWarnsBeforeEventsAreLost(t *testing.T) {
	env := eventstest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The test server's streams, with limits of an hour and 64 KiB.
	for _, name := range []string{events.StreamRuns, events.StreamCalls, events.StreamSandbox} {
		s, err := env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxAge, cfg.MaxBytes = time.Hour, 64<<10
		if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	specs := ConsumerSpecs()
	for _, spec := range specs {
		if _, err := provision.EnsureConsumer(ctx, env.JS, spec); err != nil {
			t.Fatal(err)
		}
	}
	fx := storetest.CompletedRun(t, "behind", "weather", storetest.TenantA, time.Now())
	pub := publish.NewPublisher(env.JS)
	for _, o := range fx.Events {
		if err := pub.Publish(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	later := time.Now().Add(45 * time.Minute)
	uses, err := checkRetention(ctx, env.JS, specs, later)
	if err != nil {
		t.Fatal(err)
	}
	var runs retentionUse
	for _, u := range uses {
		if u.Stream == events.StreamRuns {
			runs = u
		}
	}
	if runs.Backlog == 0 || runs.AgeRatio < 0.74 || runs.AgeRatio > 0.76 || runs.BytesRatio <= 0 || runs.BytesRatio >= 1 {
		t.Fatalf("runs stream use = %+v; want a backlog at 0.75 of the max age and part of the max bytes", runs)
	}
	reg := prometheus.NewRegistry()
	gauge := newRetentionGauge(service.NewMetrics(reg, "recorder"))
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	reportRetention(log, gauge, runs)
	if got := testutil.ToFloat64(gauge.WithLabelValues(events.StreamRuns, "age")); got != runs.AgeRatio {
		t.Errorf("age gauge %v; want %v", got, runs.AgeRatio)
	}
	if !strings.Contains(logs.String(), "TOOLWIRE_STREAM_MAX_AGE") || !strings.Contains(logs.String(), "stream="+events.StreamRuns) {
		t.Errorf("no warning naming the stream and TOOLWIRE_STREAM_MAX_AGE: %s", logs.String())
	}
	full := runs
	full.BytesRatio = 0.9
	logs.Reset()
	reportRetention(log, gauge, full)
	if !strings.Contains(logs.String(), "TOOLWIRE_STREAM_MAX_BYTES") {
		t.Errorf("no warning naming TOOLWIRE_STREAM_MAX_BYTES: %s", logs.String())
	}

	// The backlog recorded (acknowledged): nothing is at risk.
	for _, spec := range specs {
		c, err := env.JS.Consumer(ctx, spec.Stream, spec.Durable)
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	uses, err = checkRetention(ctx, env.JS, specs, later)
	if err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	for _, u := range uses {
		if u.Backlog != 0 || u.AgeRatio != 0 || u.BytesRatio != 0 {
			t.Errorf("after the backlog is recorded: %+v", u)
		}
		reportRetention(log, gauge, u)
	}
	if logs.Len() != 0 {
		t.Errorf("warnings without a backlog: %s", logs.String())
	}
}
