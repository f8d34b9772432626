package service_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/service"
)

func TestMetricsNamingScheme(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := service.NewMetrics(reg, "executor")
	calls := m.CounterVec("tool_calls_total", "Tool calls.", "tool", "code")
	m.Histogram("tool_call_duration_seconds", "Wall time.", nil)
	m.Gauge("tool_calls_in_flight", "Calls running.")
	require.NoError(t, m.Err())
	calls.WithLabelValues(service.ToolLabel("echo", "1.0.0"), "ok").Inc()
	require.InDelta(t, 1, testutil.ToFloat64(calls.WithLabelValues("echo@1.0.0", "ok")), 0)

	// A second replica on the same registry shares the collector.
	again := service.NewMetrics(reg, "executor").CounterVec("tool_calls_total", "Tool calls.", "tool", "code")
	again.WithLabelValues("echo@1.0.0", "ok").Inc()
	require.InDelta(t, 2, testutil.ToFloat64(calls.WithLabelValues("echo@1.0.0", "ok")), 0)

	bad := service.NewMetrics(nil, "policy")
	bad.Counter("verdicts", "no _total")
	bad.Gauge("depth_total", "a gauge is not a total")
	bad.Counter("Verdicts_total", "not snake case")
	err := bad.Err()
	require.ErrorContains(t, err, "metric toolwire_policy_verdicts: a counter's name ends in _total")
	require.ErrorContains(t, err, "metric toolwire_policy_depth_total: only counters end in _total")
	require.ErrorContains(t, err, "metric toolwire_policy_Verdicts_total: want lower snake case")

	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "toolwire_policy_verdicts_total", Help: "x"}))
	c := service.NewMetrics(clash, "policy")
	c.Counter("verdicts_total", "y")
	require.ErrorContains(t, c.Err(), "register metric")

	require.Equal(t, "echo@1.0.0", service.ToolLabel("echo", "1.0.0"))
	require.Equal(t, "echo", service.ToolLabel("echo", ""))
}

func TestRegisterMetrics(t *testing.T) {
	type svcMetrics struct {
		consumers *service.ConsumerMetrics
		jobs      prometheus.Counter
	}
	build := func(name string) func(*service.Metrics, *service.ConsumerMetrics) svcMetrics {
		return func(r *service.Metrics, consumers *service.ConsumerMetrics) svcMetrics {
			return svcMetrics{consumers: consumers, jobs: r.Counter(name, "Jobs.")}
		}
	}
	reg := prometheus.NewRegistry()
	m, err := service.RegisterMetrics(reg, "sandbox", build("jobs_total"))
	require.NoError(t, err)
	require.NotNil(t, m.consumers)
	m.jobs.Inc()
	again, err := service.RegisterMetrics(reg, "sandbox", build("jobs_total"))
	require.NoError(t, err)
	again.jobs.Inc()
	require.InDelta(t, 2, testutil.ToFloat64(m.jobs), 0, "replicas on one registry share the collectors")

	_, err = service.RegisterMetrics(reg, "sandbox", build("jobs"))
	require.EqualError(t, err, "sandbox: metric toolwire_sandbox_jobs: a counter's name ends in _total")
}

func TestConsumerMetricsObserveRunners(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := service.NewMetrics(reg, "policy")
	c := service.NewConsumerMetrics(m)
	require.NoError(t, m.Err())
	var obs consume.Observer = c
	obs.HandlerFailed("TOOLWIRE_CALLS", "policy-calls", false)
	obs.HandlerFailed("TOOLWIRE_CALLS", "policy-calls", true)
	obs.Redelivered("TOOLWIRE_CALLS", "policy-calls")
	obs.DeadLettered("TOOLWIRE_CALLS", "policy-calls", consume.DeadLetterObject)
	n, err := testutil.GatherAndCount(reg, "toolwire_policy_handler_failures_total", "toolwire_policy_redeliveries_total",
		"toolwire_policy_dead_letters_total")
	require.NoError(t, err)
	require.Equal(t, 4, n, "two failure series, one redelivery series, one dead-letter series")
}

// The consumer metrics also hear of retries in place
// (events.TransientObserver); their lag is TestConsumerLagIsScraped's.
func TestConsumerMetricsCountRetriesInPlace(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := service.NewMetrics(reg, "executor")
	c := service.NewConsumerMetrics(m)
	require.NoError(t, m.Err())
	var retry consume.TransientObserver = c
	retry.TransientRetried("TOOLWIRE_CALLS", "executor-default")
	retry.TransientRetried("TOOLWIRE_CALLS", "executor-default")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP toolwire_executor_infrastructure_retries_total Handler calls retried in place because NATS or JetStream did not answer (no delivery budget used), by stream and consumer.
# TYPE toolwire_executor_infrastructure_retries_total counter
toolwire_executor_infrastructure_retries_total{consumer="executor-default",stream="TOOLWIRE_CALLS"} 2
`), "toolwire_executor_infrastructure_retries_total"))
}
