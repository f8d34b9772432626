package service_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
)

// A service's publisher (Deps.Core) counts every failed publish on the
// service's metrics, by event type, and logs it on the service's logger
// with its subject and event id.
func TestCorePublisherCountsAndLogsFailures(t *testing.T) {
	env := eventstest.Start(t)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	m, err := service.RegisterMetrics(reg, "policy", func(_ *service.Metrics, c *service.ConsumerMetrics) *service.ConsumerMetrics { return c })
	require.NoError(t, err)
	var _ publish.Observer = m
	core := service.Deps{JS: env.JS, Log: slog.New(slog.NewJSONHandler(&logs, nil))}.WithDefaults().Core("policy", m)

	ok := eventstest.CallStarted(t, 1)
	require.NoError(t, core.Pub.Publish(eventstest.Context(t), ok))
	nowhere := eventstest.CallStarted(t, 2)
	nowhere.Subject = "nowhere.at.all"
	require.Error(t, core.Pub.Publish(eventstest.Context(t), nowhere))

	n, err := testutil.GatherAndCount(reg, "toolwire_policy_publish_failures_total")
	require.NoError(t, err)
	require.Equal(t, 1, n, "one series: the failed event's type")
	got, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range got {
		if mf.GetName() == "toolwire_policy_publish_failures_total" {
			require.Equal(t, "type", mf.GetMetric()[0].GetLabel()[0].GetName())
			require.Equal(t, events.TypeCallStarted, mf.GetMetric()[0].GetLabel()[0].GetValue())
			require.InDelta(t, 1, mf.GetMetric()[0].GetCounter().GetValue(), 0)
		}
	}
	require.Contains(t, logs.String(), `"subject":"nowhere.at.all"`)
	require.Contains(t, logs.String(), `"event_id":"`+nowhere.Event.ID()+`"`)
	require.NotContains(t, logs.String(), ok.Event.ID())
}
