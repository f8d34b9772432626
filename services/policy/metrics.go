package policy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
)

// Kinds of check, the "kind" label of the metrics. The guard judges tool
// calls only: the loop rules (max_iterations, max_budget before a model
// call) run in the orchestrator, whose turn events carry their verdicts, so
// the "iteration" kind is gone. The label stays, so that dashboards keep
// their queries and a further kind of check has its place.
const (
	kindCall = "call"
)

// metrics counts the guard's verdicts.
type metrics struct {
	// consumers counts what the service\'s consumers go through (failures,
	// redeliveries, dead letters).
	consumers *service.ConsumerMetrics

	verdicts  *prometheus.CounterVec // kind, outcome
	denials   *prometheus.CounterVec // kind, rule
	approvals *prometheus.CounterVec // outcome
	unserved  *prometheus.CounterVec // queue
	runOver   *prometheus.CounterVec // what: turn, approval; reason: deadline, ended
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	return service.RegisterMetrics(reg, "policy", func(r *service.Metrics, consumers *service.ConsumerMetrics) *metrics {
		m := &metrics{
			consumers: consumers,
			verdicts: r.CounterVec("verdicts_total",
				"Verdicts published by the Policy Guard, by kind of check (call: the loop rules' verdicts are on the orchestrator's turn events) and outcome (approved, denied).", "kind", "outcome"),
			denials: r.CounterVec("denials_total",
				"Denials published by the Policy Guard, by kind of check and the rule that denied.", "kind", "rule"),
			approvals: r.CounterVec("approvals_total",
				"Tool call approvals by outcome: requested, approved, denied, revised, expired (no decision in time), ignored (a decision for a call that awaited none).", "outcome"),
			unserved: r.CounterVec("unserved_calls_total",
				"Allowed calls answered PROVIDER_ERROR because no live worker served their queue within the queue wait, by queue.", "queue"),
			runOver: r.CounterVec("calls_of_ended_runs_total",
				"Turns whose calls were not judged, and approvals settled without an outcome, because their run was over: past its deadline (reason deadline) or ended (reason ended).", "what", "reason"),
		}
		// Export every verdict series from the start, so that rates work at once.
		for _, o := range []string{"approved", "denied"} {
			m.verdicts.WithLabelValues(kindCall, o)
		}
		return m
	})
}

// observe counts one published verdict.
func (m *metrics) observe(kind string, dec rules.Decision) {
	m.verdicts.WithLabelValues(kind, dec.Outcome()).Inc()
	if !dec.Allowed {
		m.denials.WithLabelValues(kind, dec.Rule).Inc()
	}
}
