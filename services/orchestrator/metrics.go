package orchestrator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/service"
)

// metrics are the orchestrator's collectors, named toolwire_orchestrator_*.
type metrics struct {
	// consumers counts what the service\'s consumers go through (failures,
	// redeliveries, dead letters).
	consumers *service.ConsumerMetrics

	runs       *prometheus.CounterVec // status
	modelCalls *prometheus.CounterVec // provider, outcome
	modelDur   prometheus.Histogram
	spend      prometheus.Counter
	reaped     prometheus.Counter
	// endsRefused counts ends decided after another end was stored.
	endsRefused prometheus.Counter
	// deltas counts the deltas of streamed model answers published.
	deltas prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	return service.RegisterMetrics(reg, "orchestrator", func(r *service.Metrics, consumers *service.ConsumerMetrics) *metrics {
		return &metrics{
			consumers:   consumers,
			runs:        r.CounterVec("runs_total", "Runs by final status (completed, failed, cancelled, rejected).", "status"),
			modelCalls:  r.CounterVec("model_calls_total", "Model calls by provider and outcome (ok, error).", "provider", "outcome"),
			modelDur:    r.Histogram("model_call_seconds", "Model call latency.", prometheus.ExponentialBuckets(0.0005, 4, 10)),
			spend:       r.Counter("model_spend_total", "Cost of the model turns recorded, in the price table's unit."),
			reaped:      r.Counter("runs_reaped_total", "Runs failed by the reaper at their deadline (each also counts in runs_total as failed)."),
			deltas:      r.Counter("model_deltas_total", "Deltas of streamed model answers published (core NATS: watchers may miss some, the turn event is the record)."),
			endsRefused: r.Counter("run_ends_refused_total", "Ends of runs that had ended already (a failure at the deadline racing a completion): refused, the run's state set to its first end."),
		}
	})
}
