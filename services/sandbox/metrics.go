package sandbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/service"
)

// metrics are the sandbox's collectors, named toolwire_sandbox_<name> by
// service.Metrics' one scheme.
type metrics struct {
	// consumers counts what the service\'s consumers go through (failures,
	// redeliveries, dead letters).
	consumers *service.ConsumerMetrics

	jobs      *prometheus.CounterVec   // runtime, outcome
	duration  *prometheus.HistogramVec // runtime
	inFlight  prometheus.Gauge
	available *prometheus.GaugeVec // runtime
	// cancelled counts the jobs of cancelled runs.
	cancelled *prometheus.CounterVec // stage: refused, killed
	// cancelsInvalid counts cancel requests dropped as malformed.
	cancelsInvalid prometheus.Counter
}

// Stages of a job its run's cancellation stopped (cancel.go).
const (
	cancelRefused = "refused" // not run
	cancelKilled  = "killed"  // killed while it ran
)

// newMetrics registers the sandbox's metrics on reg; replicas sharing a
// registry share the collectors.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	return service.RegisterMetrics(reg, "sandbox", func(r *service.Metrics, consumers *service.ConsumerMetrics) *metrics {
		return &metrics{
			consumers: consumers,
			jobs: r.CounterVec("jobs_total",
				"Sandbox jobs run, by runtime and outcome (ok, or the error code and the limit hit).", "runtime", "outcome"),
			duration: r.HistogramVec("job_duration_seconds",
				"Wall time of sandbox jobs, start of the runtime included, by runtime.",
				prometheus.ExponentialBuckets(0.01, 2, 14), // 10ms to ~80s
				"runtime"),
			inFlight: r.Gauge("jobs_in_flight", "Sandbox jobs being run by this process."),
			available: r.GaugeVec("runtime_available",
				"1 when the runtime passed its trial job at start, else 0.", "runtime"),
			cancelled: r.CounterVec("jobs_cancelled_total",
				"Jobs stopped because their run was cancelled: not run (stage refused) or killed while they ran (stage killed).", "stage"),
			cancelsInvalid: r.Counter("cancel_requests_invalid_total",
				"Cancel requests dropped because they could not be decoded or are not valid."),
		}
	})
}

// runtimeLabel is the runtime label of a result: "none" for a job refused
// before any runtime ran it.
func runtimeLabel(r string) string {
	if r == "" {
		return "none"
	}
	return r
}
